"""Queries behind GET /audit. Each aggregates in the database and returns few rows:
the audit of 10,000 nodes must not pull their 360,000 latest results into Python."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import Integer, cast, func, select, true, tuple_
from sqlalchemy.orm import Session, aliased

from numparity_server.analysis.consensus import Support
from numparity_server.kit.db import chunked, lookup
from numparity_server.models import (
    Device,
    Environment,
    Latest,
    LatestCount,
    Node,
    Outcome,
    Result,
    Run,
    stable_identity,
)
from numparity_server.reads.results import run_ids_of_results

STRICT = "strict"
_KEY = (Outcome.suite, Outcome.workload, Outcome.workload_version, Outcome.device)
# A strict key groups devices by model: a node's eight GPUs at cuda:0 … cuda:7 are peers.
_STRICT_KEY = (Outcome.suite, Outcome.workload, Outcome.workload_version, Device.model)


def nodes_per_environment(session: Session) -> tuple[int, dict[int, int]]:
    """How many nodes there are, and how many have each environment as their current one
    (an aggregate: the audit of 100,000 nodes does not read them one by one)."""
    per_env: dict[int, int] = {}
    total = 0
    for env_id, count in session.execute(
            select(Node.environment_id, func.count()).group_by(Node.environment_id)):
        total += int(count)
        if env_id is not None:
            per_env[int(env_id)] = int(count)
    return total, per_env


def silent_nodes(session: Session, *, before: datetime) -> Sequence[Any]:
    """The nodes whose newest upload arrived before ``before``: (id, name, last_seen),
    through the index on last_seen."""
    return session.execute(
        select(Node.id, Node.name, Node.last_seen).where(Node.last_seen < before)).all()


def changed_nodes(session: Session, *, since: datetime) -> list[int]:
    """The nodes that changed environment since ``since`` (index on
    environment_changed_at)."""
    return [int(pk) for pk in session.scalars(
        select(Node.id).where(Node.environment_changed_at >= since))]


def nodes_on(session: Session, environments: Iterable[int], *, limit: int | None
             ) -> list[tuple[str, int]]:
    """(name, environment_id) of the nodes whose current environment is one of these, the
    first ``limit`` by name (every one with None)."""
    wanted = sorted(set(environments))
    if not wanted:
        return []
    query = (select(Node.name, Node.environment_id).where(Node.environment_id.in_(wanted))
             .order_by(Node.name))
    if limit is not None:
        query = query.limit(limit)
    return [(name, int(env_id)) for name, env_id in session.execute(query)]


def current_environments(session: Session, names: Iterable[str]) -> dict[str, int | None]:
    """node name → its current environment."""
    return lookup(session, Node.name, Node.environment_id, set(names))


def env_keys(session: Session) -> dict[int, str]:
    """environment id → env_key (without the documents ``environments`` reads)."""
    return {row.id: row.env_key
            for row in session.execute(select(Environment.id, Environment.env_key))}


def environments(session: Session) -> Sequence[Any]:
    return session.execute(
        select(Environment.id, Environment.env_key, Environment.gpu_name,
               Environment.compute_capability, Environment.driver, Environment.cuda,
               Environment.cudnn, Environment.torch, Environment.cpu_capability)
    ).all()


def latest_by_outcome(session: Session) -> Sequence[Any]:
    """The fleet's latest results in a few hundred rows, as ingest counts them
    (``latest_counts``): (environment_id, outcome_id, device model, devices, first node
    name, then the wall times: summed, their squares summed, how many, the spreads
    summed, how many)."""
    return session.execute(
        select(LatestCount.environment_id, LatestCount.outcome_id, LatestCount.model,
               LatestCount.devices, LatestCount.first_node, LatestCount.wall_sum,
               LatestCount.wall_sq_sum, LatestCount.walls, LatestCount.spread_sum,
               LatestCount.spreads)
        .where(LatestCount.devices > 0)
    ).all()


@dataclass(frozen=True)
class Held:
    """Latest results of one outcome in one environment on one device model (a
    ``latest_by_outcome`` row). Each device of a node holds its own latest results, so
    ``nodes`` counts devices: a node's identical GPUs are each other's peers."""

    environment: int
    outcome: Any  # the outcome row (``outcomes``)
    model: str  # the devices' model (``devices.model``)
    nodes: int
    first_node: str  # the first of the nodes by name (consensus's tie-break)
    timing: Timing | None  # None when no result has a wall time

    @property
    def support(self) -> Support:
        return Support(self.nodes, self.first_node)


@dataclass(frozen=True)
class Timing:
    """The wall times of the results of a ``Held`` row that have one."""

    mean_s: float
    mean_sq_s: float  # the mean of the squares
    results: int
    spread_s: float | None  # the mean spread of those that sent one
    spreads: int


def held(session: Session) -> list[Held]:
    """The fleet's latest results as (environment, outcome) counts, with their outcomes:
    a few hundred rows for 10,000 nodes. Most of the audit is read from these."""
    aggregate = latest_by_outcome(session)
    found = outcomes(session, [row[1] for row in aggregate])
    return [Held(env_id, found[outcome_id], model, int(count), first_node,
                 _timing(*times))
            for env_id, outcome_id, model, count, first_node, *times in aggregate]


def _timing(total: Any, squares: Any, timed: int, spreads: Any, spread_count: int
            ) -> Timing | None:
    if not timed:
        return None
    return Timing(float(total) / timed, float(squares) / timed, int(timed),
                  float(spreads) / spread_count if spread_count else None, int(spread_count))


def outcomes(session: Session, ids: Iterable[int]) -> dict[int, Any]:
    found: dict[int, Any] = {}
    for part in chunked(sorted(set(ids))):
        found.update((row.id, row) for row in session.execute(
            select(Outcome.id, *_KEY, Outcome.variant, Outcome.status, Outcome.manifest_hash,
                   Outcome.input_hash, Outcome.param_hash, Outcome.repeats,
                   Outcome.repeats_agree, Outcome.checks)
            .where(Outcome.id.in_(part))
        ))
    return found


def nodes_holding(session: Session, outcome_ids: Iterable[int]
                  ) -> list[tuple[str, int, int]]:
    """(node name, environment_id, outcome_id) of each latest result of these outcomes."""
    return _of_outcomes(session, select(Node.name, Latest.environment_id, Latest.outcome_id)
                        .join(Node, Node.id == Latest.node_id), outcome_ids)


def _of_pairs(session: Session, query: Any, pairs: Iterable[tuple[int, int]]) -> list[Any]:
    """``query``'s rows for the latest results of these (environment_id, outcome_id), a
    chunk at a time (``latest`` is found through its index on the two): the outcomes of
    each environment as one list, a condition per environment rather than per pair."""
    by_env: dict[int, list[int]] = {}
    for env_id, outcome_id in sorted(set(pairs)):
        by_env.setdefault(env_id, []).append(outcome_id)
    found: list[Any] = []
    for env_id, outcome_ids in by_env.items():
        for part in chunked(outcome_ids):
            found.extend(session.execute(query.where(
                Latest.environment_id == env_id, Latest.outcome_id.in_(part))).all())
    return found


def _of_outcomes(session: Session, query: Any, outcome_ids: Iterable[int]) -> list[Any]:
    """``query``'s rows for the latest results of these outcomes, a chunk of ids at a time
    (``latest`` is found through its index on outcome_id)."""
    found: list[Any] = []
    for part in chunked(sorted(set(outcome_ids))):
        found.extend(session.execute(query.where(Latest.outcome_id.in_(part))).all())
    return found


def newest_run_ids(session: Session, node_ids: Sequence[int]) -> dict[int, str]:
    """node id → run_id of the newest run holding one of its latest results (by order
    time, then run_id): the nodes' latest rows first, then the runs of those at each
    node's newest order time (``run_ids_of_results``)."""
    newest: dict[int, tuple[Any, list[int]]] = {}
    for part in chunked(sorted(set(node_ids))):
        for node_id, started_at, result_id in session.execute(
                select(Latest.node_id, Latest.started_at, Latest.result_id)
                .where(Latest.node_id.in_(part))):
            at, results = newest.setdefault(node_id, (started_at, []))
            if started_at > at:
                newest[node_id] = (started_at, [result_id])
            elif started_at == at:
                results.append(result_id)
    runs = run_ids_of_results(session, [pk for _at, found in newest.values() for pk in found])
    return {node_id: max(runs[pk] for pk in found) for node_id, (_at, found) in newest.items()}


def run_ids_holding(session: Session, firsts: Mapping[tuple[int, int], str]
                    ) -> dict[tuple[int, int], str]:
    """(environment_id, outcome_id) → the run_id of the latest result holding it on the
    node given (its first node by name, which the counts know): the nodes' few latest
    rows, not the thousands holding a usual answer."""
    wanted: dict[str, set[tuple[int, int]]] = {}
    for pair, node in firsts.items():
        wanted.setdefault(node, set()).add(pair)
    found: dict[tuple[int, int], int] = {}
    for part in chunked(sorted(wanted)):
        for name, env_id, outcome_id, result_id in session.execute(
                select(Node.name, Latest.environment_id, Latest.outcome_id, Latest.result_id)
                .join(Latest, Latest.node_id == Node.id).where(Node.name.in_(part))):
            pair = (env_id, outcome_id)
            if pair in wanted[name]:
                found[pair] = min(found.get(pair, result_id), result_id)
    runs = run_ids_of_results(session, found.values())
    return {pair: runs[result_id] for pair, result_id in found.items()}


def devices_holding(session: Session, pairs: Iterable[tuple[int, int]]
                    ) -> list[tuple[int, int, int]]:
    """(device_id, environment_id, outcome_id) of each latest result of these
    (environment_id, outcome_id): ``latest`` alone, for callers that need no node name
    or run."""
    return _of_pairs(session, select(Latest.device_id, Latest.environment_id,
                                     Latest.outcome_id), pairs)


class Holding(NamedTuple):
    name: str  # the node's
    environment_id: int
    outcome_id: int
    result_id: int  # its run: ``run_ids_of_results``, for the rows a page shows
    device_id: int


def latest_holding(session: Session, outcome_ids: Iterable[int]) -> list[Holding]:
    """The latest results holding one of these outcomes, by node name: ``latest`` through
    its index on outcome_id, then the nodes' names by key."""
    rows = _of_outcomes(session, select(Latest.node_id, Latest.environment_id,
                                        Latest.outcome_id, Latest.result_id,
                                        Latest.device_id), outcome_ids)
    names = lookup(session, Node.id, Node.name, {row.node_id for row in rows})
    return sorted((Holding(names[row.node_id], row.environment_id, row.outcome_id,
                           row.result_id, row.device_id) for row in rows),
                  key=lambda row: row.name)


class StudyRow(NamedTuple):
    node: str
    environment: int
    model: str
    outcome_id: int
    nondeterminism: dict[str, Any] | None


def nondeterminism_studies(session: Session, outcome_ids: Iterable[int]) -> list[StudyRow]:
    """The latest results holding these (disagreeing) outcomes, each with its node's name,
    environment, device model and the agent's ``nondeterminism`` (design §2.13)."""
    rows = _of_outcomes(session, select(Latest.node_id, Latest.environment_id, Latest.model,
                                        Latest.outcome_id, Result.nondeterminism)
                        .join(Result, Result.id == Latest.result_id), outcome_ids)
    names = lookup(session, Node.id, Node.name, {row.node_id for row in rows})
    return sorted((StudyRow(names[row.node_id], row.environment_id, row.model,
                            row.outcome_id, row.nondeterminism) for row in rows),
                  key=lambda row: (row.node, row.outcome_id))


def devices_with_unusual_answers(session: Session, *, usual_manifests: Sequence[str],
                                 since: datetime) -> set[int]:
    """Devices with a strict ok result since ``since`` whose manifest is none of
    ``usual_manifests`` (every environment's usual answers).

    Driven by the unusual outcomes (a handful) through the index on results.outcome_id,
    so its cost follows the number of unusual results, not the length of the history.
    The outcomes go to the second query as values: PostgreSQL then estimates their
    results by each value's statistics (rare ones are rare), where from a subquery it
    guessed the average outcome's thousands each and scanned every result.
    """
    unusual = sorted(int(pk) for pk in session.scalars(select(Outcome.id).where(
        Outcome.variant == STRICT, Outcome.status == "ok",
        Outcome.manifest_hash.not_in(sorted(set(usual_manifests))) if usual_manifests
        else true())))
    held: list[tuple[int, int]] = []  # (device, run) of each unusual result
    for part in chunked(unusual):
        held.extend((int(device), int(run)) for device, run in session.execute(
            select(Result.device_id, Result.run_pk)
            .where(Result.outcome_id.in_(part), Result.device_id.is_not(None))))
    # Their runs within the window, by key: joined in one query, the planner took the
    # runs of the whole window into a hash (40 ms at 100,000 nodes) for a few hundred.
    recent: set[int] = set()
    for part in chunked(sorted({run for _device, run in held})):
        recent.update(int(pk) for pk in session.scalars(
            select(Run.id).where(Run.id.in_(part), Run.started_at >= since)))
    return {device for device, run in held if run in recent}


def strict_history(session: Session, *, devices: Iterable[int], since: datetime
                   ) -> Sequence[Any]:
    """These devices' strict ok answers since ``since``, on whichever node they ran:
    (device_id, environment_id, suite, workload, version, model, manifest_hash, runs,
    drill runs, run_id and slot of the newest of those runs (by started_at, then id),
    newest_at: its started_at)."""
    rows: list[Any] = []
    group = (Result.device_id, Run.environment_id, *_STRICT_KEY, Outcome.manifest_hash)
    for part in chunked(sorted(set(devices))):
        newest_first = (Run.started_at.desc(), Run.id.desc())
        answers = (
            select(*(column.label(f"c{i}") for i, column in enumerate(group)),
                   Run.drill, Run.started_at,
                   func.first_value(Run.run_id).over(partition_by=group,
                                                     order_by=newest_first).label("run_id"),
                   func.first_value(Outcome.device).over(partition_by=group,
                                                         order_by=newest_first).label("slot"))
            .select_from(Run)
            .join(Result, Result.run_pk == Run.id)
            .join(Outcome, Outcome.id == Result.outcome_id)
            .join(Device, Device.id == Result.device_id)
            .where(Result.device_id.in_(part), Outcome.variant == STRICT,
                   Outcome.status == "ok", Run.started_at >= since)
            .subquery())
        keys = [answers.c[f"c{i}"].label(column.key) for i, column in enumerate(group)]
        rows.extend(session.execute(
            select(*keys, func.count().label("runs"),
                   func.sum(cast(answers.c.drill, Integer)).label("drill_runs"),
                   func.max(answers.c.run_id).label("run_id"),
                   func.max(answers.c.slot).label("slot"),
                   func.max(answers.c.started_at).label("newest_at"))
            .group_by(*(answers.c[f"c{i}"] for i in range(len(group))))
        ).all())
    return rows


def devices(session: Session, ids: Iterable[int]) -> dict[int, Any]:
    """device id → (id, slot, uuid, serial, name, model, pci_bus_id, node: the name of
    the node it sits on now, None once it left)."""
    found: dict[int, Any] = {}
    for part in chunked(sorted(set(ids))):
        found.update((row.id, row) for row in session.execute(
            select(Device.id, Device.slot, Device.uuid, Device.serial, Device.name,
                   Device.model, Device.pci_bus_id, Device.type, Node.name.label("node"))
            .outerjoin(Node, Node.id == Device.node_id)
            .where(Device.id.in_(part))))
    return found


def environment_changes(session: Session, *, node_ids: Sequence[int], since: datetime
                        ) -> Sequence[Any]:
    """Consecutive runs of one of these nodes (by started_at) on different environments
    since ``since``: (node, run id, run_id, previous run id, previous run_id, started_at,
    environment_id, previous environment_id)."""
    rows: list[Any] = []
    for part in chunked(sorted(set(node_ids))):
        ordered = (
            select(
                Run.node_id, Run.id, Run.run_id, Run.started_at, Run.environment_id,
                func.lag(Run.environment_id).over(
                    partition_by=Run.node_id, order_by=(Run.started_at, Run.id)
                ).label("prev_env"),
                func.lag(Run.id).over(
                    partition_by=Run.node_id, order_by=(Run.started_at, Run.id)
                ).label("prev_id"),
                func.lag(Run.run_id).over(
                    partition_by=Run.node_id, order_by=(Run.started_at, Run.id)
                ).label("prev_run"),
            )
            .where(Run.started_at >= since, Run.node_id.in_(part))
            .subquery()
        )
        rows.extend(session.execute(
            select(Node.name, ordered.c.id, ordered.c.run_id, ordered.c.prev_id,
                   ordered.c.prev_run, ordered.c.started_at, ordered.c.environment_id,
                   ordered.c.prev_env)
            .join(Node, Node.id == ordered.c.node_id)
            .where(ordered.c.prev_env.is_not(None),
                   ordered.c.prev_env != ordered.c.environment_id)
        ).all())
    rows.sort(key=lambda row: (row.started_at, row.name), reverse=True)
    return rows


def moved_devices(session: Session, *, since: datetime) -> list[int]:
    """Devices that showed up on another node since ``since`` (``devices.moved_at``)."""
    return [int(pk) for pk in session.scalars(
        select(Device.id).where(Device.moved_at >= since))]


def device_moves(session: Session, *, device_ids: Sequence[int], since: datetime
                 ) -> Sequence[Any]:
    """Consecutive runs of one of these devices (by started_at) on different nodes since
    ``since``: (device_id, slot, uuid, node, run id, run_id, previous node, previous run id,
    previous run_id, started_at, environment_id, previous environment_id)."""
    rows: list[Any] = []
    for part in chunked(sorted(set(device_ids))):
        used = (select(Result.device_id, Run.id, Run.run_id, Run.node_id, Run.started_at,
                       Run.environment_id)
                .distinct()
                .join(Run, Run.id == Result.run_pk)
                .where(Result.device_id.in_(part), Run.started_at >= since)
                .subquery())
        order = (used.c.started_at, used.c.id)
        ordered = select(
            used.c.device_id, used.c.id, used.c.run_id, used.c.node_id, used.c.started_at,
            used.c.environment_id,
            func.lag(used.c.node_id).over(partition_by=used.c.device_id, order_by=order)
            .label("prev_node"),
            func.lag(used.c.id).over(partition_by=used.c.device_id, order_by=order)
            .label("prev_id"),
            func.lag(used.c.run_id).over(partition_by=used.c.device_id, order_by=order)
            .label("prev_run"),
            func.lag(used.c.environment_id).over(partition_by=used.c.device_id,
                                                 order_by=order).label("prev_env"),
        ).subquery()
        previous = aliased(Node)
        rows.extend(session.execute(
            select(ordered.c.device_id, Device.slot, Device.uuid, Node.name,
                   ordered.c.id, ordered.c.run_id, previous.name.label("prev_name"),
                   ordered.c.prev_id, ordered.c.prev_run, ordered.c.started_at,
                   ordered.c.environment_id, ordered.c.prev_env)
            .join(Device, Device.id == ordered.c.device_id)
            .join(Node, Node.id == ordered.c.node_id)
            .join(previous, previous.id == ordered.c.prev_node)
            .where(ordered.c.prev_node != ordered.c.node_id)
        ).all())
    rows.sort(key=lambda row: (row.started_at, row.name), reverse=True)
    return rows


def count_devices(session: Session) -> int:
    """Devices that sit on a node."""
    return session.scalar(
        select(func.count()).select_from(Device).where(Device.node_id.is_not(None))) or 0


def strict_voters(session: Session, pairs: Iterable[tuple[int, int]]
                  ) -> list[tuple[int, int, str, str, bool, int]]:
    """Who holds these (environment, outcome) pairs among the latest results:
    (environment_id, outcome_id, model, node name, stable, devices), ``stable`` for
    devices known by a UUID or serial (each a voter), not for those known by their slot
    or claiming another node's device (all of a node's together one voter)."""
    stable = stable_identity()
    found: list[tuple[int, int, str, str, bool, int]] = []
    for part in chunked(sorted(set(pairs))):
        found.extend(
            (int(env), int(outcome), model, node, bool(is_stable), int(devices))
            for env, outcome, model, node, is_stable, devices in session.execute(
                select(Latest.environment_id, Latest.outcome_id, Latest.model, Node.name,
                       stable, func.count())
                .join(Device, Device.id == Latest.device_id)
                .join(Node, Node.id == Latest.node_id)
                .where(tuple_(Latest.environment_id, Latest.outcome_id).in_(part))
                .group_by(Latest.environment_id, Latest.outcome_id, Latest.model, Node.name,
                          stable)))
    return found
