"""What the audit and its summary both read: the nodes, their latest results, the usual
strict answers and the history of the devices that deviated from them.

The audit judges devices: each device of a node (a GPU, a MIG instance, the CPU) holds
its own latest results, and the devices of one model on one environment are peers,
within a node as across nodes. A device's history follows it (its UUID) from node to
node."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from numparity_server.analysis.audit import (
    Deviation,
    Key,
    Majority,
    VoterRow,
    majorities,
    usual_answers,
    voter_majority,
)
from numparity_server.analysis.policy import Policy
from numparity_server.audit import repository
from numparity_server.audit.repository import Held


@dataclass(frozen=True)
class History:
    """Strict answers since the window's start of the devices that ever answered
    unusually, and those devices."""

    deviating: list[Any]  # rows whose answer is not their environment's usual one
    rows: list[Any]  # every row of those devices (``repository.strict_history``)
    devices: dict[int, Any]  # device id → where it sits now (``repository.devices``)


@dataclass(frozen=True)
class Fleet:
    """What both the audit and its summary read: the nodes counted by environment, the
    silent ones, their latest results, the usual strict answers and the history of the
    nodes that deviated from them."""

    nodes: int
    env_nodes: dict[int, int]  # environment → the nodes whose current one it is
    silent: Sequence[Any]  # (id, name, last_seen) of the stale nodes
    held: list[Held]
    strict: list[Held]  # the latest ok strict results
    majority: dict[tuple[int, Key], Majority]  # the usual answers that judge
    history: History
    since: datetime  # the window's start
    devices: int  # devices that sit on a node


def judged_fleet(session: Session, policy: Policy, now: datetime) -> Fleet:
    """The fleet read for ``now`` (the history window ends there)."""
    since = now - timedelta(days=policy.window_days)
    nodes, env_nodes = repository.nodes_per_environment(session)
    held = repository.held(session)
    strict = [h for h in held if h.outcome.variant == repository.STRICT
              and h.outcome.status == "ok" and h.outcome.manifest_hash]
    usual = usual_answers((h.environment, held_key(h), h.outcome.manifest_hash, h.support)
                          for h in strict)
    # Where answers differ, count voters instead of devices (a node's devices without a
    # stable identity are one voter) and note whose devices hold each majority; then the
    # same for the keys of devices whose history deviates.
    answers: dict[tuple[int, Key], set[str]] = defaultdict(set)
    for h in strict:
        answers[(h.environment, held_key(h))].add(h.outcome.manifest_hash)
    usual.update(_voted(session, strict, {k for k, found in answers.items() if len(found) > 1}))
    history = read_history(session, strict, usual, since)
    usual.update(_voted(session, strict, {
        found for row in history.deviating
        if (found := (row.environment_id, strict_key(row))) in usual
        and not usual[found].from_nodes}))
    return Fleet(nodes=nodes, env_nodes=env_nodes,
                 silent=repository.silent_nodes(
                     session, before=now - timedelta(hours=policy.stale_after_hours)),
                 held=held, strict=strict,
                 majority=majorities(usual, min_peers=policy.min_peers),
                 history=history, since=since,
                 devices=repository.count_devices(session))


def _voted(session: Session, strict: Sequence[Held], keys: Collection[tuple[int, Key]]
           ) -> dict[tuple[int, Key], Majority]:
    """The usual answer of each of ``keys`` counted in voters (``voter_majority``)."""
    if not keys:
        return {}
    manifests = {(h.environment, h.outcome.id, h.model): (held_key(h), h.outcome.manifest_hash)
                 for h in strict if (h.environment, held_key(h)) in keys}
    rows: dict[tuple[int, Key], list[VoterRow]] = defaultdict(list)
    for env, outcome, model, node, stable, devices in repository.strict_voters(
            session, {(env, outcome) for env, outcome, _model in manifests}):
        if (env, outcome, model) not in manifests:
            continue  # another model's devices holding the same outcome
        key, manifest = manifests[(env, outcome, model)]
        rows[(env, key)].append(VoterRow(manifest, node, devices if stable else 0,
                                         0 if stable else devices))
    return {found: voter_majority(voters) for found, voters in rows.items()}


def strict_key(row: Any) -> Key:
    """The strict key of a history row: suite, workload, version, device model."""
    return (row.suite, row.workload, row.workload_version, row.model)


def held_key(held: Held) -> Key:
    """The strict key of latest results."""
    outcome = held.outcome
    return (outcome.suite, outcome.workload, outcome.workload_version, held.model)


def read_history(session: Session, strict: Sequence[Held],
                 usual: Mapping[tuple[int, Key], Majority], since: datetime) -> History:
    """The usual answer of an (environment, key) is the most common among the latest
    results. A device answered unusually if its latest answer is not its environment's
    usual one, or if some answer in the window is no environment's usual answer; only
    those devices' histories are read, so the cost follows the unusual, not the fleet.
    Only devices that sit on a node count: a GPU its node no longer has (replaced) is
    judged again when it shows up on a node, with its history."""
    unusual_now = {(h.environment, h.outcome.id) for h in strict
                   if usual[(h.environment, held_key(h))].manifest_hash
                   != h.outcome.manifest_hash}
    candidates = {device for device, _env, _outcome in repository.devices_holding(
                      session, unusual_now)}
    candidates |= repository.devices_with_unusual_answers(
        session, usual_manifests=[found.manifest_hash for found in usual.values()],
        since=since)
    devices = {pk: row for pk, row in repository.devices(session, candidates).items()
               if row.node is not None}
    rows = list(repository.strict_history(session, devices=devices, since=since))
    deviating = [row for row in rows
                 if (found := usual.get((row.environment_id, strict_key(row))))
                 and found.manifest_hash != row.manifest_hash]
    return History(deviating=deviating, rows=rows, devices=devices)


def deviations(history: History, rows: Sequence[Any] | None = None) -> list[Deviation]:
    """History rows (the deviating ones unless given) as the analysis's deviations."""
    return [Deviation(device=row.device_id, node=history.devices[row.device_id].node,
                      environment=row.environment_id, key=strict_key(row),
                      manifest_hash=row.manifest_hash, runs=int(row.runs),
                      drill_runs=int(row.drill_runs or 0), run_id=row.run_id,
                      slot=row.slot, newest_at=row.newest_at)
            for row in (history.deviating if rows is None else rows)]
