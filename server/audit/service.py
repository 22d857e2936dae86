"""GET /audit: the lab audit (DESIGN §3.3) from a handful of aggregate queries."""

from __future__ import annotations

import csv
import io
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy.orm import Session

from numparity_server import analysis
from numparity_server.analysis.audit import (
    Deviation,
    Key,
    Majority,
    classify_suspects,
    majorities,
    repeat_disagreements,
    strict_changes,
    usual_answers,
)
from numparity_server.analysis.consensus import (
    Inputs,
    Support,
    broken_inputs,
    fleet_inputs,
    tally,
)
from numparity_server.analysis.policy import Policy
from numparity_server.audit import repository
from numparity_server.reads.results import results_of_runs

INVENTORY_COLUMNS = ("gpu_name", "compute_capability", "driver", "cuda", "cudnn", "torch",
                     "cpu_capability")
STATUSES = ("ok", "suspect", "watch", "nondeterministic", "stale")


@dataclass(frozen=True)
class _Held:
    """Latest results of one outcome in one environment (from ``latest_by_outcome``)."""

    environment: int
    outcome: Any  # the outcome row
    nodes: int
    wall_s: float | None  # mean over the results that have one
    first_node: str  # the first of the nodes by name (consensus's tie-break)

    @property
    def support(self) -> Support:
        return Support(self.nodes, self.first_node)


def audit(*, session: Session, policy: Policy, now: datetime | None = None) -> dict[str, Any]:
    now = now or datetime.now(timezone.utc)
    since = now - timedelta(days=policy.window_days)
    nodes = repository.nodes(session)
    environments = {row.id: row for row in repository.environments(session)}
    env_keys = {env_id: row.env_key for env_id, row in environments.items()}

    # The whole fleet's latest results as (environment, outcome) counts: a few hundred
    # rows for 10,000 nodes. Most of the audit is read from these.
    aggregate = repository.latest_by_outcome(session)
    outcomes = repository.outcomes(session, [row[1] for row in aggregate])
    held = [_Held(env_id, outcomes[outcome_id], int(count),
                  float(wall_sum) / timed if timed else None, first_node)
            for env_id, outcome_id, count, wall_sum, timed, first_node in aggregate]

    node_env = {node.name: node.environment_id for node in nodes
                if node.environment_id is not None}

    strict, usual = _usual_answers(held)
    history = _history(session, strict, usual, since)
    suspects = _suspects(session, policy, env_keys, history.deviating, usual, strict)
    nondeterministic = _nondeterministic(session, held, history.rows, env_keys)
    stale = _stale(session, nodes, now, policy)
    policy_rows = _policy(policy, node_env, environments)
    broken = _broken_inputs(session, held)
    statuses = _statuses([node.name for node in nodes], suspects, nondeterministic, stale)
    return analysis.json_safe({
        "generated_at": now.isoformat(),
        "window_days": policy.window_days,
        "summary": {
            "nodes": len(nodes),
            "environments": len(set(node_env.values())),
            **{status: sum(1 for found in statuses.values() if status in found)
               for status in STATUSES},
            "policy_violations": len({row["node"] for row in policy_rows}),
            "broken_inputs": len({row["node"] for row in broken}),
        },
        "inventory": _inventory(node_env, environments),
        "stale": stale,
        "policy": policy_rows,
        "suspects": suspects,
        "nondeterministic": nondeterministic,
        "broken_inputs": broken,
        "drift": _drift(session, nodes, environments, since),
        "determinism_cost": _determinism_cost(held, env_keys),
    })


def _statuses(names: Iterable[str], suspects: Sequence[Mapping[str, Any]],
              nondeterministic: Sequence[Mapping[str, Any]],
              stale: Sequence[Mapping[str, Any]]) -> dict[str, set[str]]:
    """Each node's statuses; ``ok`` when it has none of the others."""
    found: dict[str, set[str]] = {name: set() for name in names}
    for entry in suspects:
        found[entry["node"]].add(entry["status"])
    for entry in nondeterministic:
        found[entry["node"]].add("nondeterministic")
    for entry in stale:
        found[entry["node"]].add("stale")
    for statuses in found.values():
        if not statuses:
            statuses.add("ok")
    return found


def _inventory(node_env: Mapping[str, int], environments: Mapping[int, Any]
               ) -> dict[str, list[dict[str, Any]]]:
    """Nodes counted by each promoted environment column (their current environment)."""
    per_env = Counter(node_env.values())
    inventory: dict[str, list[dict[str, Any]]] = {}
    for column in INVENTORY_COLUMNS:
        counts: Counter[str | None] = Counter()
        for env_id, count in per_env.items():
            counts[getattr(environments[env_id], column)] += count
        inventory[column] = [{"value": value, "nodes": count} for value, count in
                             sorted(counts.items(), key=lambda item: (-item[1], str(item[0])))]
    return inventory


def _stale(session: Session, nodes: Sequence[Any], now: datetime, policy: Policy
           ) -> list[dict[str, Any]]:
    """Nodes whose newest upload arrived more than ``stale_after_hours`` ago."""
    limit = now - timedelta(hours=policy.stale_after_hours)
    stale = [node for node in nodes if node.last_seen < limit]
    run_ids = repository.newest_run_ids(session, [node.id for node in stale])
    rows = [
        {"node": node.name, "last_seen": node.last_seen.isoformat(),
         "hours_since": round((now - node.last_seen).total_seconds() / 3600, 1),
         "last_run_id": run_ids.get(node.id)}
        for node in stale
    ]
    rows.sort(key=lambda row: (-row["hours_since"], row["node"]))
    return rows


def _policy(policy: Policy, node_env: Mapping[str, int], environments: Mapping[int, Any]
            ) -> list[dict[str, Any]]:
    """One row per node and broken rule, judged on the node's current environment."""
    if not policy.allowed and not policy.required:
        return []
    per_env = {
        env_id: policy.violations(analysis.flatten_environment(environments[env_id].document))
        for env_id in set(node_env.values())
    }
    return [
        {"node": node, "env_key": environments[env_id].env_key, **violation.to_dict()}
        for node, env_id in sorted(node_env.items())
        for violation in per_env[env_id]
    ]


def _key(outcome: Any) -> Key:
    return (outcome.suite, outcome.workload, outcome.workload_version, outcome.device)


def _row_key(row: Any) -> Key:
    return (row.suite, row.workload, row.workload_version, row.device)


def _usual_answers(held: Sequence[_Held]
                   ) -> tuple[list[_Held], dict[tuple[int, Key], Majority]]:
    """The latest ok strict results, and the usual answer of each (environment, key)."""
    strict = [h for h in held if h.outcome.variant == repository.STRICT
              and h.outcome.status == "ok" and h.outcome.manifest_hash]
    return strict, usual_answers(
        (h.environment, _key(h.outcome), h.outcome.manifest_hash, h.support) for h in strict)


@dataclass(frozen=True)
class _History:
    """Strict answers since the window's start of the nodes that ever answered unusually."""

    deviating: list[Any]  # rows whose answer is not their environment's usual one
    rows: list[Any]  # every row of those nodes (strict_history)


def _history(session: Session, strict: Sequence[_Held],
             usual: Mapping[tuple[int, Key], Majority], since: datetime) -> _History:
    """The usual answer of an (environment, key) is the most common among the latest
    results. A node answered unusually if its latest answer is not its environment's
    usual one, or if some answer in the window is no environment's usual answer; only
    those nodes' histories are read, so the cost follows the unusual, not the fleet."""
    unusual_now = [h.outcome.id for h in strict
                   if usual[(h.environment, _key(h.outcome))].manifest_hash
                   != h.outcome.manifest_hash]
    unusual_envs = {(h.environment, h.outcome.id) for h in strict if h.outcome.id in unusual_now}
    candidates = {row.name for row in repository.latest_holding(session, unusual_now)
                  if (row.environment_id, row.outcome_id) in unusual_envs}
    candidates |= repository.nodes_with_unusual_answers(
        session, usual_manifests=[found.manifest_hash for found in usual.values()],
        since=since)
    rows = list(repository.strict_history(session, nodes=candidates, since=since))
    deviating = [row for row in rows
                 if (found := usual.get((row.environment_id, _row_key(row))))
                 and found.manifest_hash != row.manifest_hash]
    return _History(deviating=deviating, rows=rows)


def _suspects(session: Session, policy: Policy, env_keys: Mapping[int, str],
              deviating: Sequence[Any], usual: Mapping[tuple[int, Key], Majority],
              strict: Sequence[_Held]) -> list[dict[str, Any]]:
    majority = majorities(usual, min_peers=policy.min_peers)
    if not majority:
        return []
    # A run holding the majority answer of each (environment, key), to compare with.
    holding = {(h.environment, _key(h.outcome)): (h.environment, h.outcome.id) for h in strict
               if (found := majority.get((h.environment, _key(h.outcome))))
               and found.manifest_hash == h.outcome.manifest_hash}
    run_ids = repository.run_ids_holding(session, holding.values())
    peer_runs = {key: run_ids[pair] for key, pair in holding.items() if pair in run_ids}

    judged = [row for row in deviating if (row.environment_id, _row_key(row)) in majority]
    answers = {(row.environment_id, row.manifest_hash) for row in judged}
    deviant = [h.outcome.id for h in strict if (h.environment, h.outcome.manifest_hash) in answers]
    manifest_of = {h.outcome.id: h.outcome.manifest_hash for h in strict}
    current = {(row.name, row.environment_id, manifest_of[row.outcome_id])
               for row in repository.latest_holding(session, deviant)}
    deviations = [
        Deviation(node=row.name, environment=row.environment_id, key=_row_key(row),
                  manifest_hash=row.manifest_hash, runs=int(row.runs),
                  drill_runs=int(row.drill_runs or 0), run_id=row.run_id,
                  latest=(row.name, row.environment_id, row.manifest_hash) in current)
        for row in judged
    ]
    return classify_suspects(deviations, majority, env_keys, peer_runs)


def _nondeterministic(session: Session, held: Sequence[_Held], history: Sequence[Any],
                      env_keys: Mapping[int, str]) -> list[dict[str, Any]]:
    disagreeing = {h.outcome.id: h.outcome for h in held if h.outcome.repeats_agree is False}
    repeats = repeat_disagreements(
        (name, o.suite, o.workload, o.workload_version, o.variant, o.device, o.repeats, run_id)
        for name, _env, outcome_id, run_id in repository.latest_holding(session, disagreeing)
        if (o := disagreeing[outcome_id])
    )
    # A strict answer that changed within one environment, drill runs left out: a node
    # that changed answered unusually at least once, so its history has been read.
    answers: dict[tuple[str, int, Key], set[str]] = defaultdict(set)
    newest: dict[tuple[str, int, Key], str] = {}
    for row in history:
        if int(row.runs) > int(row.drill_runs or 0):
            found = (row.name, row.environment_id, _row_key(row))
            answers[found].add(row.manifest_hash)
            newest[found] = max(newest.get(found, row.run_id), row.run_id)
    changes = strict_changes(
        (name, env_keys.get(env_id, ""), key, len(manifests), newest[(name, env_id, key)])
        for (name, env_id, key), manifests in answers.items() if len(manifests) > 1
    )
    return sorted([*repeats, *changes], key=lambda row: (row["node"], row["reason"],
                                                          row["workload"], row["variant"]))


def _broken_inputs(session: Session, held: Sequence[_Held]) -> list[dict[str, Any]]:
    """Latest results whose input or parameter bytes differ from the fleet's (DESIGN §2.1:
    those bytes are the same everywhere by construction; a difference is a bug)."""
    holders: dict[tuple[Any, ...], list[tuple[Inputs, Support]]] = defaultdict(list)
    by_hashes: dict[tuple[Any, ...], list[int]] = defaultdict(list)
    for h in held:
        o = h.outcome
        if o.status != "ok":
            continue
        key = (o.suite, o.workload, o.workload_version, o.variant)
        holders[key].append(((o.input_hash, o.param_hash), h.support))
        by_hashes[key + (o.input_hash, o.param_hash)].append(o.id)
    minority: dict[int, dict[str, Any]] = {}
    for key, found in holders.items():
        hashes = tally(found)
        fleet = fleet_inputs(hashes)
        if fleet is None:
            continue
        fleet_input, fleet_param = fleet
        for input_hash, param_hash in hashes:
            differing = broken_inputs((input_hash, param_hash), fleet)
            if not differing:
                continue
            for outcome_id in by_hashes[key + (input_hash, param_hash)]:
                minority[outcome_id] = {
                    "suite": key[0], "workload": key[1], "workload_version": key[2],
                    "variant": key[3], "differs": differing,
                    "input_hash": input_hash, "fleet_input_hash": fleet_input,
                    "param_hash": param_hash, "fleet_param_hash": fleet_param,
                }
    rows = [{"node": name, "run_id": run_id, **minority[outcome_id]}
            for name, _env, outcome_id, run_id in repository.latest_holding(session, minority)]
    rows.sort(key=lambda row: (row["node"], row["workload"], row["variant"]))
    return rows


def _drift(session: Session, nodes: Sequence[Any], environments: Mapping[int, Any],
           since: datetime) -> list[dict[str, Any]]:
    """Environment changes of a node between consecutive runs: the attributes that changed
    and the results whose answer changed with them. Only the runs of nodes that changed
    environment within the window are read (``nodes.environment_changed_at``)."""
    changed = [node.id for node in nodes if node.environment_changed_at is not None
               and node.environment_changed_at >= since]
    changes = repository.environment_changes(session, node_ids=changed, since=since)
    if not changes:
        return []
    run_ids = {row.id for row in changes} | {row.prev_id for row in changes}
    results: dict[int, dict[tuple[str, str, str, str], str | None]] = defaultdict(dict)
    for row in results_of_runs(session, sorted(run_ids)):
        if row.status == "ok":
            results[row.run_pk][(row.suite, row.workload, row.variant, row.device)] = \
                row.manifest_hash
    flattened: dict[int, dict[str, str]] = {}

    def flat(env_id: int) -> dict[str, str]:
        if env_id not in flattened:
            flattened[env_id] = analysis.flatten_environment(environments[env_id].document)
        return flattened[env_id]

    rows = []
    for change in changes:
        now, before = results[change.id], results[change.prev_id]
        changed = [
            {"suite": key[0], "workload": key[1], "variant": key[2], "device": key[3]}
            for key in sorted(now.keys() & before.keys()) if now[key] != before[key]
        ]
        rows.append({
            "node": change.name, "run_id": change.run_id, "previous_run_id": change.prev_run,
            "started_at": change.started_at.isoformat(),
            "env_key": environments[change.environment_id].env_key,
            "previous_env_key": environments[change.prev_env].env_key,
            "attributes": [{"attribute": d["attribute"], "before": d["a"], "after": d["b"]}
                           for d in analysis.environment_diff(flat(change.prev_env),
                                                              flat(change.environment_id))],
            "outputs_changed": changed,
        })
    return rows


def _determinism_cost(held: Sequence[_Held], env_keys: Mapping[int, str]
                      ) -> list[dict[str, Any]]:
    """Per environment: mean wall time of ``strict`` against ``default`` per workload and
    summed over the workloads that have both."""
    totals: dict[int, dict[str, dict[str, list[float]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(lambda: [0.0, 0.0])))
    for h in held:
        o = h.outcome
        if o.status != "ok" or o.variant not in ("default", "strict") or h.wall_s is None:
            continue
        total = totals[h.environment][o.workload][o.variant]
        total[0] += h.wall_s * h.nodes
        total[1] += h.nodes
    rows: list[dict[str, Any]] = []
    for env_id, workloads in totals.items():
        means = {w: {variant: s / n for variant, (s, n) in v.items() if n}
                 for w, v in sorted(workloads.items())}
        both = {w: v for w, v in means.items() if {"default", "strict"} <= v.keys()}
        if not both:
            continue
        default_s = sum(v["default"] for v in both.values())
        strict_s = sum(v["strict"] for v in both.values())
        rows.append({
            # Nodes counted once per workload measured: the most of any workload.
            "env_key": env_keys.get(env_id),
            "nodes": max(int(workloads[w]["default"][1]) for w in both),
            "default_s": default_s, "strict_s": strict_s,
            "ratio": strict_s / default_s if default_s > 0 else None,
            "workloads": [{"workload": w, "default_s": v["default"], "strict_s": v["strict"],
                           "ratio": v["strict"] / v["default"] if v["default"] > 0 else None}
                          for w, v in both.items()],
        })
    rows.sort(key=lambda row: (-float(row["ratio"] or 0), str(row["env_key"] or "")))
    return rows


# The tables of ?format=csv: name → (the report's list, its columns).
CSV_TABLES: dict[str, tuple[str, tuple[str, ...]]] = {
    "stale": ("stale", ("node", "last_seen", "hours_since", "last_run_id")),
    "policy": ("policy", ("node", "env_key", "attribute", "value", "rule", "expected")),
    "suspects": ("suspects", ("node", "status", "env_key", "peers", "majority_nodes",
                              "disagreeing_runs", "drill", "drill_runs",
                              "currently_disagrees")),
    "nondeterministic": ("nondeterministic", ("node", "reason", "suite", "workload",
                                              "workload_version", "variant", "device",
                                              "run_id", "detail")),
    "broken_inputs": ("broken_inputs", ("node", "run_id", "suite", "workload",
                                        "workload_version", "variant", "differs",
                                        "input_hash", "fleet_input_hash", "param_hash",
                                        "fleet_param_hash")),
    "drift": ("drift", ("node", "run_id", "previous_run_id", "started_at", "attributes",
                        "outputs_changed")),
    "determinism_cost": ("determinism_cost", ("env_key", "nodes", "default_s", "strict_s",
                                              "ratio")),
}


def _cell(value: Any) -> Any:
    if isinstance(value, list):
        return "; ".join(_cell(item) for item in value)
    if isinstance(value, dict):
        if "attribute" in value:
            return f"{value['attribute']}: {value.get('before')} -> {value.get('after')}"
        return "/".join(str(v) for v in value.values() if v is not None)
    return "" if value is None else value


def findings(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per node and finding, across the tables: what needs someone's attention."""
    rows = []
    for entry in report["suspects"]:
        drill = " (drill)" if entry["drill"] else ""
        rows.append({"node": entry["node"], "finding": entry["status"] + drill,
                     "detail": f"strict answers differ from {entry['majority_nodes']} of "
                               f"{entry['peers']} same-environment peers in "
                               f"{entry['disagreeing_runs']} run(s)"})
    for entry in report["nondeterministic"]:
        rows.append({"node": entry["node"], "finding": "nondeterministic",
                     "detail": entry["detail"]})
    for entry in report["stale"]:
        rows.append({"node": entry["node"], "finding": "stale",
                     "detail": f"no upload for {entry['hours_since']} h"})
    for entry in report["policy"]:
        rows.append({"node": entry["node"], "finding": "policy",
                     "detail": f"{entry['attribute']} is {entry['value']}, "
                               f"{entry['rule']}: {', '.join(entry['expected'])}"})
    for entry in report["broken_inputs"]:
        rows.append({"node": entry["node"], "finding": "broken_inputs",
                     "detail": f"{' and '.join(entry['differs'])} of {entry['workload']} "
                               f"({entry['variant']}) differ from the fleet's"})
    for entry in report["drift"]:
        if entry["outputs_changed"]:
            names = ", ".join(a["attribute"] for a in entry["attributes"][:5])
            rows.append({"node": entry["node"], "finding": "drift",
                         "detail": f"{len(entry['outputs_changed'])} result(s) changed with "
                                   f"{names}"})
    return rows


def to_csv(report: Mapping[str, Any], table: str) -> str:
    """One table of the report as CSV (``findings``: every finding, a row each)."""
    columns: tuple[str, ...]
    if table == "findings":
        rows, columns = findings(report), ("node", "finding", "detail")
    elif table == "inventory":
        rows = [{"attribute": attribute, "value": entry["value"], "nodes": entry["nodes"]}
                for attribute, entries in report["inventory"].items() for entry in entries]
        columns = ("attribute", "value", "nodes")
    else:
        name, columns = CSV_TABLES[table]
        rows = report[name]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow([_cell(row.get(column)) for column in columns])
    return out.getvalue()


TABLES = ("findings", "inventory", *CSV_TABLES)
