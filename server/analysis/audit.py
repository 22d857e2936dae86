"""The audit's judgements over plain rows (design §3.3): suspect hardware, nondeterminism.

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
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import ClassVar

from .consensus import Support, judges, tally, usual

# (suite, workload, workload_version, device): what makes two strict results comparable.
Key = tuple[str, str, "int | None", str]

SUSPECT_RUNS = 2  # disagreeing runs (of one key) that make a node suspect rather than watched


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


@dataclass(frozen=True)
class SuspectKey:
    """A key a node disagreed on, and in how many runs."""

    suite: str
    workload: str
    workload_version: int | None
    variant: str  # always strict
    device: str
    runs: int
    drill_runs: int


@dataclass(frozen=True)
class PeerComparison:
    """A run holding the majority answer (``run_a``) against the node's newest
    disagreeing run (``run_b``), on one strict key."""

    run_a: str | None
    run_b: str
    suite: str
    workload: str
    workload_version: int | None
    variant: str
    device: str


@dataclass(frozen=True)
class Suspect:
    node: str
    status: str  # suspect or watch
    env_key: str | None
    peers: int
    majority_nodes: int
    disagreeing_runs: int
    drill: bool
    drill_runs: int
    currently_disagrees: bool
    keys: list[SuspectKey]
    compare: PeerComparison


def _strict(key: Key) -> tuple[str, str, int | None, str, str]:
    """(suite, workload, workload_version, variant, device) of a strict key."""
    suite, workload, version, device = key
    return suite, workload, version, "strict", device


def _key_order(key: Key) -> tuple[str, str, int, str]:
    """Keys by suite, workload, version (an unknown version first) and device."""
    suite, workload, version, device = key
    return suite, workload, version or 0, device


def suspect_status(runs: int) -> str:
    return "suspect" if runs >= SUSPECT_RUNS else "watch"


def _judged_by_node(deviations: Iterable[Deviation],
                    majority: Mapping[tuple[int, Key], Majority]
                    ) -> dict[str, list[Deviation]]:
    by_node: dict[str, list[Deviation]] = defaultdict(list)
    for deviation in deviations:
        if (deviation.environment, deviation.key) in majority:
            by_node[deviation.node].append(deviation)
    return dict(sorted(by_node.items()))


def _runs_by_key(found: Iterable[Deviation]) -> tuple[dict[Key, int], dict[Key, int]]:
    """A node's disagreeing runs and drill runs per key. A corrupting GPU usually spoils
    every workload of a run, so the node's count is its largest per key, not their sum."""
    runs: dict[Key, int] = defaultdict(int)
    drills: dict[Key, int] = defaultdict(int)
    for deviation in found:
        runs[deviation.key] += deviation.runs
        drills[deviation.key] += deviation.drill_runs
    return runs, drills


def _worst(runs_by_key: Mapping[Key, int]) -> Key:
    return max(runs_by_key, key=lambda key: (runs_by_key[key], key[1]))


def suspect_statuses(deviations: Iterable[Deviation],
                     majority: Mapping[tuple[int, Key], Majority]) -> dict[str, str]:
    """node → ``suspect`` or ``watch``, as ``classify_suspects`` says, without reading
    which answers are current or which peer runs to compare with."""
    statuses = {}
    for node, found in _judged_by_node(deviations, majority).items():
        runs, _drills = _runs_by_key(found)
        statuses[node] = suspect_status(runs[_worst(runs)])
    return statuses


def classify_suspects(deviations: Iterable[Deviation],
                      majority: Mapping[tuple[int, Key], Majority],
                      env_keys: Mapping[int, str],
                      peer_runs: Mapping[tuple[int, Key], str],
                      current: Collection[tuple[str, int, str]]) -> list[Suspect]:
    """One entry per node that disagreed with its peers: ``suspect`` (2+ runs) or ``watch``.

    ``peer_runs`` names a run holding the majority answer of each (environment, key), for
    a comparison link; ``current`` holds the (node, environment, manifest) of the answers
    that are a node's latest.
    """
    entries = []
    for node, found in _judged_by_node(deviations, majority).items():
        runs_by_key, drills_by_key = _runs_by_key(found)
        worst = _worst(runs_by_key)
        runs = runs_by_key[worst]
        drill_runs = drills_by_key[worst]

        def latest(d: Deviation) -> bool:
            return (d.node, d.environment, d.manifest_hash) in current

        newest = max(found, key=lambda d: (latest(d), d.key == worst, d.run_id))
        chosen = majority[(newest.environment, newest.key)]
        entries.append(Suspect(
            node=node, status=suspect_status(runs),
            env_key=env_keys.get(newest.environment), peers=chosen.nodes - 1,
            majority_nodes=chosen.holders, disagreeing_runs=runs, drill=drill_runs > 0,
            drill_runs=drill_runs, currently_disagrees=any(latest(d) for d in found),
            keys=[SuspectKey(*_strict(key), runs=runs_by_key[key],
                             drill_runs=drills_by_key[key])
                  for key in sorted(runs_by_key, key=_key_order)],
            compare=PeerComparison(peer_runs.get((newest.environment, newest.key)),
                                   newest.run_id, *_strict(newest.key))))
    return entries


@dataclass(frozen=True)
class StrictChanged:
    """A node whose strict answer for a key changed within one environment."""

    reason: ClassVar[str] = "strict_changed"
    node: str
    env_key: str
    suite: str
    workload: str
    workload_version: int | None
    variant: str
    device: str
    distinct_answers: int
    run_id: str  # the newest run giving one of those answers

    @property
    def detail(self) -> str:
        return f"{self.distinct_answers} different strict answers for {self.workload} " \
               "on one environment"


def strict_changes(rows: Iterable[tuple[str, str, Key, int, str]]) -> list[StrictChanged]:
    """``(node, env_key, key, distinct_manifests, newest_run_id)`` rows of a node whose
    strict answer changed within one environment, by node and key."""
    return [
        StrictChanged(node, env_key, *_strict(key), distinct_answers=distinct, run_id=run_id)
        for node, env_key, key, distinct, run_id in sorted(
            rows, key=lambda r: (r[0], *_key_order(r[2])))
    ]


@dataclass(frozen=True)
class RepeatsDisagree:
    """A latest result whose repeats gave different bits."""

    reason: ClassVar[str] = "repeats_disagree"
    node: str
    suite: str
    workload: str
    workload_version: int | None
    variant: str
    device: str
    repeats: int
    run_id: str

    @property
    def detail(self) -> str:
        return (f"the {self.repeats} repeats of {self.workload} under {self.variant} gave "
                "different bits")


def repeat_disagreements(rows: Iterable[RepeatsDisagree]) -> list[RepeatsDisagree]:
    """Latest results whose repeats disagree, by node, suite, workload, variant, device."""
    return sorted(rows, key=lambda r: (r.node, r.suite, r.workload, r.variant, r.device))
