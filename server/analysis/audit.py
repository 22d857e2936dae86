"""The audit's judgements over plain rows (DESIGN §3.3): suspect hardware, nondeterminism.

Suspect hardware: in the ``strict`` variant every node of one ``env_key`` must compute
the same bits. The majority answer of a key is the manifest held by more than half of
an environment's nodes (their latest results). A node whose ``strict`` manifest differs
from it, while it has at least ``min_peers`` peers, disagreed in that run; disagreeing
in two or more runs makes it ``suspect``, once ``watch``. Runs marked as drills
(``run --fault-drill``) count like any other, and the entry says they were drills.

Nondeterminism: a result whose repeats disagree, or a node whose ``strict`` answer for
a key changed while its environment did not (drills left out).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .consensus import Support, judges, tally, usual

# (suite, workload, workload_version, device): what makes two strict results comparable.
Key = tuple[str, str, "int | None", str]


def key_dict(key: Key) -> dict[str, Any]:
    suite, workload, version, device = key
    return {"suite": suite, "workload": workload, "workload_version": version,
            "variant": "strict", "device": device}


@dataclass(frozen=True)
class Majority:
    manifest_hash: str
    holders: int  # nodes holding the majority answer
    nodes: int  # nodes of the environment with a result for the key


def usual_answers(rows: Iterable[tuple[int, Key, str, Support]]
                  ) -> dict[tuple[int, Key], Majority]:
    """``(environment, key, manifest, support)`` rows → the usual answer of each
    (environment, key), by the consensus rule (``consensus.usual``)."""
    by_env: dict[tuple[int, Key], list[tuple[str, Support]]] = defaultdict(list)
    for environment, key, manifest, support in rows:
        by_env[(environment, key)].append((manifest, support))
    found = {}
    for env_key, holders in by_env.items():
        answers = tally(holders)
        chosen = usual(answers)
        assert chosen is not None
        found[env_key] = Majority(chosen, answers[chosen].nodes,
                                  sum(support.nodes for support in answers.values()))
    return found


def majorities(usual: Mapping[tuple[int, Key], Majority], *, min_peers: int
               ) -> dict[tuple[int, Key], Majority]:
    """The usual answers that judge their environment (``consensus.judges``: more than
    half of its nodes give it and a node there has at least ``min_peers`` peers)."""
    return {env_key: found for env_key, found in usual.items()
            if judges(found.holders, found.nodes, min_peers=min_peers)}


@dataclass(frozen=True)
class Deviation:
    """A node's strict answer that is not its environment's majority answer.

    ``runs`` runs of the node gave ``manifest_hash`` for ``key`` (``drill_runs`` of them
    were drills); ``run_id`` is the newest of them.
    """

    node: str
    environment: int
    key: Key
    manifest_hash: str
    runs: int
    drill_runs: int
    run_id: str
    latest: bool  # it is the node's current answer


def classify_suspects(deviations: Iterable[Deviation],
                      majority: Mapping[tuple[int, Key], Majority],
                      env_keys: Mapping[int, str],
                      peer_runs: Mapping[tuple[int, Key], str]) -> list[dict[str, Any]]:
    """One entry per node that disagreed with its peers: ``suspect`` (2+ runs) or ``watch``.

    A node's disagreeing runs are counted per key and the largest count is the node's
    (a corrupting GPU usually spoils every workload of a run, so counting runs per key
    does not count one bad run several times). ``peer_runs`` names a run holding the
    majority answer of each (environment, key), for a comparison link.
    """
    by_node: dict[str, list[Deviation]] = defaultdict(list)
    for deviation in deviations:
        if (deviation.environment, deviation.key) in majority:
            by_node[deviation.node].append(deviation)
    entries = []
    for node, found in sorted(by_node.items()):
        runs_by_key: dict[Key, int] = defaultdict(int)
        drills_by_key: dict[Key, int] = defaultdict(int)
        for deviation in found:
            runs_by_key[deviation.key] += deviation.runs
            drills_by_key[deviation.key] += deviation.drill_runs
        worst = max(runs_by_key, key=lambda key: (runs_by_key[key], key[1]))
        runs = runs_by_key[worst]
        drill_runs = drills_by_key[worst]
        newest = max(found, key=lambda d: (d.latest, d.key == worst, d.run_id))
        chosen = majority[(newest.environment, newest.key)]
        entries.append({
            "node": node,
            "status": "suspect" if runs >= 2 else "watch",
            "env_key": env_keys.get(newest.environment),
            "peers": chosen.nodes - 1,
            "majority_nodes": chosen.holders,
            "disagreeing_runs": runs,
            "drill": drill_runs > 0,
            "drill_runs": drill_runs,
            "currently_disagrees": any(d.latest for d in found),
            "keys": [
                {**key_dict(key), "runs": runs_by_key[key], "drill_runs": drills_by_key[key]}
                for key in sorted(runs_by_key, key=lambda k: (k[0], k[1], k[2] or 0, k[3]))
            ],
            "compare": {"run_a": peer_runs.get((newest.environment, newest.key)),
                        "run_b": newest.run_id, **key_dict(newest.key)},
        })
    return entries


def strict_changes(rows: Iterable[tuple[str, str, Key, int, str]]
                   ) -> list[dict[str, Any]]:
    """``(node, env_key, key, distinct_manifests, newest_run_id)`` rows of a node whose
    strict answer changed within one environment → nondeterminism entries."""
    return [
        {"node": node, "reason": "strict_changed", "env_key": env_key, **key_dict(key),
         "distinct_answers": distinct, "run_id": run_id,
         "detail": f"{distinct} different strict answers for {key[1]} on one environment"}
        for node, env_key, key, distinct, run_id in sorted(
            rows, key=lambda r: (r[0], r[2][0], r[2][1], r[2][2] or 0, r[2][3]))
    ]


def repeat_disagreements(rows: Iterable[Sequence[Any]]) -> list[dict[str, Any]]:
    """``(node, suite, workload, workload_version, variant, device, repeats, run_id)`` of
    latest results whose repeats disagree → nondeterminism entries."""
    return [
        {"node": node, "reason": "repeats_disagree", "suite": suite, "workload": workload,
         "workload_version": version, "variant": variant, "device": device,
         "repeats": repeats, "run_id": run_id,
         "detail": f"the {repeats} repeats of {workload} under {variant} gave different bits"}
        for node, suite, workload, version, variant, device, repeats, run_id in sorted(
            rows, key=lambda r: (r[0], r[1], r[2], r[4], r[5]))
    ]
