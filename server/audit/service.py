"""GET /audit: the lab audit (design §3.3) from a handful of aggregate queries, and its
node status counts alone (``audit_summary``, what /metrics reads).

The queries are ``repository``'s, the statistics ``analysis``'s (plain values in, plain
dataclasses out); this module reads the one, feeds the other and fills ``schemas``."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import Any, Generic, TypeVar

from pydantic import BaseModel
from sqlalchemy.orm import Session

from numparity_server.analysis import data_pipeline
from numparity_server.analysis.audit import (
    DeviceLabel,
    Key,
    RepeatsDisagree,
    Suspect,
    classify_suspects,
    device_statuses,
    node_suspect_statuses,
    repeat_disagreements,
    strict_changes,
    suspect_statuses,
)
from numparity_server.analysis.broken import broken_results
from numparity_server.analysis.determinism_cost import WallTime, determinism_cost
from numparity_server.analysis.drift import attribute_changes, outputs_changed
from numparity_server.analysis.fleet_policy import (
    broken_requirements,
    check_violations,
    environment_violations,
)
from numparity_server.analysis.inventory import INVENTORY_COLUMNS, inventory_of
from numparity_server.analysis.node_status import StaleNode, flagged_counts, stale_nodes
from numparity_server.analysis.nondeterminism import (
    Repeated,
    Study,
    determinism,
    environment_cause,
)
from numparity_server.analysis.numerics import Reported, numerics
from numparity_server.analysis.policy import Policy
from numparity_server.audit import repository
from numparity_server.audit.fleet import Fleet, deviations, held_key, judged_fleet, strict_key
from numparity_server.audit.proof import proof_of_catch
from numparity_server.audit.repository import Held
from numparity_server.audit.schemas import (
    AuditOut,
    AuditSummary,
    AuditTotals,
    BrokenInputsRow,
    DataPipelineRow,
    DeterminismCostRow,
    DeterminismRow,
    DriftRow,
    InventoryRow,
    NodeStatusCounts,
    NondeterministicRow,
    NumericsRow,
    PolicyRow,
    RepeatsDisagreeRow,
    StaleRow,
    StrictChangedRow,
    SuspectRow,
)
from numparity_server.goldens import drift as goldens
from numparity_server.reads import environments as reads_environments
from numparity_server.reads.results import results_of_runs, run_ids_of_results


def audit(*, session: Session, policy: Policy, now: datetime | None = None,
          limit: int | None = None, offset: int = 0) -> AuditOut:
    """The audit as of ``now``: the summary (of every node), and a page of each table
    (``limit`` rows from ``offset``; every row with None), with ``totals``.

    The runs the rows name are looked up for the page's rows only: a lab of 100,000 nodes
    has thousands of stale or nondeterministic nodes, which the summary counts."""
    now = now or datetime.now(timezone.utc)
    page = slice(offset, None if limit is None else offset + limit)
    fleet = judged_fleet(session, policy, now)
    environments = {row.id: row for row in repository.environments(session)}
    env_keys = {env_id: row.env_key for env_id, row in environments.items()}
    suspects = _suspects(session, fleet, env_keys)
    held_nondeterministic = _nondeterministic(session, fleet, env_keys)
    nondeterministic = _with_run_ids(session, held_nondeterministic[page])
    stale_entries = _stale_nodes(fleet, now, policy)
    stale = _stale(session, fleet, stale_entries[page])
    violations = _policy(session, fleet, policy, environments, page)
    held_broken = _broken_inputs(session, fleet.held)
    broken = _with_run_ids(session, held_broken[page])
    drift, drift_total = _drift(session, fleet, environments, page)
    pinned = goldens.drift(session=session, policy=policy)
    counts = _counts(fleet, suspects=node_suspect_statuses(suspects),
                     devices=[suspect.status for suspect in suspects],
                     nondeterministic={row.node for row in held_nondeterministic},
                     stale={entry.node for entry in stale_entries})
    columns = {env_id: {column: getattr(row, column) for column in INVENTORY_COLUMNS}
               for env_id, row in environments.items()}
    return AuditOut(
        generated_at=now.isoformat(),
        window_days=policy.window_days,
        summary=AuditSummary(**counts.model_dump(),
                             policy_violations=violations.nodes,
                             broken_inputs=len({row.node for row in held_broken}),
                             off_pin_devices=sum(row.devices for row in pinned)),
        limit=limit, offset=offset,
        totals=AuditTotals(stale=len(stale_entries), policy=violations.rows,
                           suspects=len(suspects), nondeterministic=len(held_nondeterministic),
                           broken_inputs=len(held_broken), drift=drift_total,
                           pinned=len(pinned)),
        inventory={column: [InventoryRow.model_validate(count) for count in values]
                   for column, values in inventory_of(fleet.env_nodes, columns).items()},
        stale=stale,
        policy=violations.page,
        suspects=[SuspectRow.model_validate(suspect) for suspect in suspects[page]],
        nondeterministic=nondeterministic,
        broken_inputs=broken,
        drift=drift,
        determinism_cost=[DeterminismCostRow.model_validate(cost) for cost in
                          determinism_cost(_wall_times(fleet.held), env_keys)],
        nondeterministic_ops=_nondeterministic_ops(session, fleet, env_keys),
        numerics=_numerics(fleet.held, env_keys),
        data_pipeline=_data_pipeline(fleet.held, env_keys),
        pinned=pinned[page],
        proof=proof_of_catch(),
    )


def audit_summary(*, session: Session, policy: Policy, now: datetime | None = None
                  ) -> NodeStatusCounts:
    """The audit's node and status counts (the same as ``audit(...).summary``'s), without
    what only the full audit shows: no inventory, policy, broken inputs, drift or cost of
    determinism, no environment documents, no comparison links, no stale nodes' runs."""
    now = now or datetime.now(timezone.utc)
    fleet = judged_fleet(session, policy, now)
    nondeterministic = _nondeterministic(session, fleet, repository.env_keys(session))
    found = deviations(fleet.history)
    return _counts(
        fleet, suspects=suspect_statuses(found, fleet.majority),
        devices=[status for _node, status in device_statuses(found, fleet.majority).values()],
        nondeterministic={row.node for row in nondeterministic},
        stale={entry.node for entry in _stale_nodes(fleet, now, policy)})


def _counts(fleet: Fleet, *, suspects: Mapping[str, str], devices: Sequence[str],
            nondeterministic: set[str], stale: set[str]) -> NodeStatusCounts:
    """``suspects``: node → its worst device's status; ``devices``: each suspect or
    watched device's status."""
    return NodeStatusCounts(nodes=fleet.nodes, environments=len(fleet.env_nodes),
                            **flagged_counts(fleet.nodes, suspects=suspects,
                                             nondeterministic=nondeterministic, stale=stale),
                            devices=fleet.devices,
                            suspect_devices=devices.count("suspect"),
                            watched_devices=devices.count("watch"))


def _suspects(session: Session, fleet: Fleet, env_keys: Mapping[int, str]) -> list[Suspect]:
    majority = fleet.majority
    if not majority:
        return []
    # A run holding the majority answer of each (environment, key), to compare with: its
    # first node's.
    holding = {(h.environment, held_key(h)): (h.environment, h.outcome.id)
               for h in fleet.strict
               if (found := majority.get((h.environment, held_key(h))))
               and found.manifest_hash == h.outcome.manifest_hash}
    firsts: dict[tuple[int, int], str] = {}
    for h in fleet.strict:
        pair = (h.environment, h.outcome.id)
        firsts[pair] = min(firsts.get(pair, h.first_node), h.first_node)
    slots = {h.outcome.id: h.outcome.device for h in fleet.strict}
    run_ids = repository.run_ids_holding(
        session, {pair: firsts[pair] for pair in holding.values()})
    peer_runs = {key: (run_ids[pair], slots[pair[1]]) for key, pair in holding.items()
                 if pair in run_ids}

    judged = [row for row in fleet.history.deviating
              if (row.environment_id, strict_key(row)) in majority]
    answers = {(row.environment_id, row.manifest_hash) for row in judged}
    deviant = [(h.environment, h.outcome.id) for h in fleet.strict
               if (h.environment, h.outcome.manifest_hash) in answers]
    manifest_of = {h.outcome.id: h.outcome.manifest_hash for h in fleet.strict}
    current = {(device, env_id, manifest_of[outcome])
               for device, env_id, outcome in repository.devices_holding(session, deviant)}
    labels = {pk: DeviceLabel(row.slot, row.uuid, row.serial, row.pci_bus_id, row.name)
              for pk, row in fleet.history.devices.items()}
    return classify_suspects(deviations(fleet.history, judged), majority, env_keys,
                             peer_runs, current, labels)


def _nondeterministic(session: Session, fleet: Fleet, env_keys: Mapping[int, str]
                      ) -> list[_Pending[NondeterministicRow]]:
    """The rows in order, made (``_with_run_ids``) only for a page: thousands at 100,000
    nodes, which the summary only counts by node."""
    disagreeing = {h.outcome.id: h.outcome for h in fleet.held
                   if h.outcome.repeats_agree is False}
    holding = repository.latest_holding(session, disagreeing)
    repeats = repeat_disagreements(
        RepeatsDisagree(held.name, o.suite, o.workload, o.workload_version, o.variant,
                        o.device, o.repeats, str(index))
        for index, held in enumerate(holding) if (o := disagreeing[held.outcome_id]))
    # A strict answer that changed within one environment, drill runs left out: a device
    # that changed answered unusually at least once, so its history has been read.
    answers: dict[tuple[int, int, Key], set[str]] = defaultdict(set)
    newest: dict[tuple[int, int, Key], str] = {}
    for row in fleet.history.rows:
        if int(row.runs) > int(row.drill_runs or 0):
            found = (row.device_id, row.environment_id, strict_key(row))
            answers[found].add(row.manifest_hash)
            newest[found] = max(newest.get(found, row.run_id), row.run_id)
    devices = fleet.history.devices
    changes = strict_changes(
        (devices[device].node, devices[device].slot, env_keys.get(env_id, ""), key,
         len(manifests), newest[(device, env_id, key)])
        for (device, env_id, key), manifests in answers.items() if len(manifests) > 1
    )
    # A repeat's run is its holding's result's (the index stands in for the run_id).
    rows: list[tuple[tuple[str, str, str, str], _Pending[NondeterministicRow]]] = [
        *(((e.node, "repeats_disagree", e.workload, e.variant),
           _Pending(e.node, RepeatsDisagreeRow, e, holding[int(e.run_id)].result_id))
          for e in repeats),
        *(((e.node, "strict_changed", e.workload, e.variant),
           _Pending(e.node, StrictChangedRow, e, None)) for e in changes)]
    return [pending for _key, pending in sorted(rows, key=lambda item: item[0])]


Row = TypeVar("Row", bound=BaseModel)


@dataclass(frozen=True)
class _Pending(Generic[Row]):
    """A row still to be made: its node, its schema and what fills it (an analysis
    dataclass, or a dict), and the result whose run it names (None: it names its own)."""

    node: str
    schema: type[Row]
    entry: Any
    result: int | None


def _with_run_ids(session: Session, rows: Sequence[_Pending[Row]]) -> list[Row]:
    """The rows made, each naming the run of its result where it has one."""
    runs = run_ids_of_results(
        session, [row.result for row in rows if row.result is not None])
    made = [row.schema.model_validate(row.entry) for row in rows]
    return [found if row.result is None else found.model_copy(update={"run_id": runs[row.result]})
            for found, row in zip(made, rows, strict=True)]


def _stale_nodes(fleet: Fleet, now: datetime, policy: Policy) -> list[StaleNode]:
    return stale_nodes({node.name: node.last_seen for node in fleet.silent}, now=now,
                       stale_after_hours=policy.stale_after_hours)


def _stale(session: Session, fleet: Fleet, stale: Sequence[StaleNode]) -> list[StaleRow]:
    """The stale nodes' rows, each with its newest run."""
    by_name = {node.name: node for node in fleet.silent}
    run_ids = repository.newest_run_ids(session, [by_name[entry.node].id for entry in stale])
    return [StaleRow(node=entry.node, last_seen=entry.last_seen.isoformat(),
                     hours_since=entry.hours_since,
                     last_run_id=run_ids.get(by_name[entry.node].id))
            for entry in stale]


def _broken_inputs(session: Session, held: Sequence[Held]
                   ) -> list[_Pending[BrokenInputsRow]]:
    """Latest results whose input or parameter bytes differ from the fleet's, each with
    the result whose run it names (``_with_run_ids``)."""
    broken = broken_results(
        (h.outcome.id, (h.outcome.suite, h.outcome.workload, h.outcome.workload_version,
                        h.outcome.variant),
         (h.outcome.input_hash, h.outcome.param_hash), h.support)
        for h in held if h.outcome.status == "ok")
    rows = [_Pending(held.name, BrokenInputsRow,
                     {"node": held.name, "run_id": "", **asdict(broken[held.outcome_id])},
                     held.result_id)
            for held in repository.latest_holding(session, broken)]
    return sorted(rows, key=lambda row: (row.node, row.entry["workload"], row.entry["variant"]))


def _drift(session: Session, fleet: Fleet, environments: Mapping[int, Any], page: slice
           ) -> tuple[list[DriftRow], int]:
    """Environment changes of a node between consecutive runs, and moves of a device (a
    GPU that showed up on another node) between its consecutive runs: the attributes
    that changed and the results whose answer changed with them. Only the runs of nodes
    that changed environment and of devices that moved within the window are read
    (``nodes.environment_changed_at``, ``devices.moved_at``), and the results of the
    page's runs alone. The page and how many rows there are in all."""
    changed = repository.changed_nodes(session, since=fleet.since)
    changes = repository.environment_changes(session, node_ids=changed, since=fleet.since)
    moves = repository.device_moves(
        session, device_ids=repository.moved_devices(session, since=fleet.since),
        since=fleet.since)
    total = len(changes) + len(moves)
    # Newest first (then by node, backwards), as the rows are listed.
    shown = sorted([*((row, True) for row in changes), *((row, False) for row in moves)],
                   key=lambda item: (item[0].started_at, item[0].name), reverse=True)[page]
    changes = [row for row, of_node in shown if of_node]
    moves = [row for row, of_node in shown if not of_node]
    if not changes and not moves:
        return [], total
    run_ids = {row.id for row in [*changes, *moves]} | {row.prev_id for row in [*changes, *moves]}
    results: dict[int, dict[tuple[str, str, str, str], str | None]] = defaultdict(dict)
    # A device's answers by key (its slot may differ between two nodes).
    on_device: dict[tuple[int, int], dict[tuple[str, str, str, str], str | None]] = \
        defaultdict(dict)
    for row in results_of_runs(session, sorted(run_ids)):
        if row.status == "ok":
            results[row.run_pk][(row.suite, row.workload, row.variant, row.device)] = \
                row.manifest_hash
            on_device[(row.run_pk, row.device_id)][(row.suite, row.workload, row.variant,
                                                    "")] = row.manifest_hash
    flattened = reads_environments.flattened(session, {
        environments[env_id].env_key: env_id
        for row in [*changes, *moves] for env_id in (row.environment_id, row.prev_env)})

    def flat(env_id: int) -> dict[str, str]:
        return flattened[environments[env_id].env_key]

    node_rows = [DriftRow.model_validate({
        "node": change.name, "run_id": change.run_id, "previous_run_id": change.prev_run,
        "started_at": change.started_at.isoformat(),
        "env_key": environments[change.environment_id].env_key,
        "previous_env_key": environments[change.prev_env].env_key,
        "attributes": attribute_changes(flat(change.prev_env), flat(change.environment_id)),
        "outputs_changed": outputs_changed(results[change.prev_id], results[change.id]),
    }) for change in changes]
    device_rows = [DriftRow.model_validate({
        "node": move.name, "device": move.slot, "device_uuid": move.uuid,
        "previous_node": move.prev_name, "run_id": move.run_id,
        "previous_run_id": move.prev_run, "started_at": move.started_at.isoformat(),
        "env_key": environments[move.environment_id].env_key,
        "previous_env_key": environments[move.prev_env].env_key,
        "attributes": attribute_changes(flat(move.prev_env), flat(move.environment_id)),
        "outputs_changed": [{**asdict(found), "device": move.slot} for found in outputs_changed(
            on_device[(move.prev_id, move.device_id)], on_device[(move.id, move.device_id)])],
    }) for move in moves]
    return sorted([*node_rows, *device_rows], key=lambda row: (row.started_at, row.node),
                  reverse=True), total


def _wall_times(held: Sequence[Held]) -> list[WallTime]:
    return [WallTime(h.environment, _suite_workload(h.outcome.suite, h.outcome.workload),
                     h.outcome.variant, h.timing.mean_s,
                     h.timing.results, h.timing.mean_sq_s, h.timing.spread_s,
                     h.timing.spreads)
            for h in held if h.outcome.status == "ok" and h.timing is not None]


def _nondeterministic_ops(session: Session, fleet: Fleet, env_keys: Mapping[int, str]
                          ) -> list[DeterminismRow]:
    """Per environment and device model: deterministic, or the ops the agents named
    (``analysis.nondeterminism``); the studies are read for the disagreeing results only."""
    repeated = [Repeated(h.environment, h.model, _suite_workload(h.outcome.suite,
                                                                 h.outcome.workload),
                         h.outcome.variant, h.nodes, bool(h.outcome.repeats_agree))
                for h in fleet.held if h.outcome.status == "ok"
                and (h.outcome.repeats or 0) >= 2 and h.outcome.repeats_agree is not None]
    outcomes = {h.outcome.id: h.outcome for h in fleet.held
                if h.outcome.repeats_agree is False}
    studies = [Study(row.environment, row.model, row.node,
                     _suite_workload(outcomes[row.outcome_id].suite,
                                     outcomes[row.outcome_id].workload),
                     outcomes[row.outcome_id].variant, row.nondeterminism)
               for row in repository.nondeterminism_studies(session, outcomes)]
    # The environments of the nondeterministic rows only (a few), flattened and kept.
    unsteady = {(r.environment, r.model) for r in repeated if not r.agree} | {
        (s.environment, s.model) for s in studies}
    flat = reads_environments.flattened(session, {env_keys[env]: env for env, _ in unsteady
                                                  if env in env_keys})
    causes = {(env, model): found for env, model in unsteady
              if (found := environment_cause(flat.get(env_keys.get(env, ""), {}), model))}
    return [DeterminismRow.model_validate(
        {**{k: v for k, v in asdict(row).items() if k not in ("environment", "model")},
         "env_key": env_keys.get(row.environment), "device_model": row.model})
        for row in determinism(repeated, studies, causes)]


def _suite_workload(suite: str, workload: str) -> str:
    """A workload as the cost of determinism names it: another suite's is another one
    (the large suite's decoder is not the standard one's)."""
    return workload if suite == "standard" else f"{suite}:{workload}"


def _numerics(held: Sequence[Held], env_keys: Mapping[int, str]) -> list[NumericsRow]:
    rows = numerics(Reported(h.environment, h.model, h.outcome.suite, h.outcome.variant,
                             h.outcome.workload, h.outcome.checks or {}, h.nodes)
                    for h in held if h.outcome.status == "ok")
    return [NumericsRow(
        env_key=env_keys.get(row.environment), device_model=row.model, suite=row.suite,
        variant=row.variant,
        devices=row.devices,
        **{field: (verdict.holds if verdict else None) for field, verdict
           in row.columns.items()},
        **{f"{field}_op": (verdict.op if verdict else None) for field, verdict
           in row.columns.items()},
        breaks=[asdict(found) for found in row.breaks]) for row in rows]


def _data_pipeline(held: Sequence[Held], env_keys: Mapping[int, str]) -> list[DataPipelineRow]:
    rows = data_pipeline.data_pipelines(
        data_pipeline.Reported(h.environment, h.outcome.suite, h.outcome.variant,
                               h.outcome.workload, h.outcome.checks or {}, h.nodes)
        for h in held if h.outcome.status == "ok")
    return [DataPipelineRow(
        env_key=env_keys.get(row.environment), suite=row.suite, workload=row.workload,
        variant=row.variant, devices=row.devices, recipe_holds=row.recipe_holds,
        without=row.without, without_holds=row.without_holds,
        needs_recipe=row.needs_recipe, workers_agree=row.workers_agree,
        recipe_broken=[b.words for b in row.breaks if b.configuration == data_pipeline.RECIPE
                       and b.check in data_pipeline.HOLDS],
        without_broken=[b.words for b in row.breaks if b.configuration == row.without
                        and b.check in data_pipeline.HOLDS],
        breaks=[{**asdict(found), "words": found.words} for found in row.breaks])
        for row in rows]


@dataclass(frozen=True)
class _Violations:
    page: list[PolicyRow]
    rows: int  # in all
    nodes: int  # with at least one


def _policy(session: Session, fleet: Fleet, policy: Policy, environments: Mapping[int, Any],
            page: slice) -> _Violations:
    """The policy table's page, by node: each node on an environment that breaks a rule
    (a row per rule it breaks), and each node whose latest results break a check
    requirement. Only the first nodes of the breaking environments by name are read,
    as many as the page could show (each gives a row at least)."""
    flattened = reads_environments.flattened(
        session, {environments[env_id].env_key: env_id for env_id in fleet.env_nodes})
    per_env = environment_violations(policy, {
        env_id: flattened[environments[env_id].env_key] for env_id in fleet.env_nodes})
    checks = _check_violations(session, fleet, policy)
    wanted = None if page.stop is None else page.stop
    on_env = repository.nodes_on(session, per_env, limit=wanted)
    if wanted is not None and len(on_env) == wanted:
        # Rows of later nodes than the last read come after the page.
        last = on_env[-1][0]
        checks_shown = [row for row in checks if row[0] <= last]
    else:
        checks_shown = checks
    rows = sorted([*((node, env_id, violation) for node, env_id in on_env
                     for violation in per_env[env_id]), *checks_shown],
                  key=lambda row: row[0])
    checked = {node for node, _env, _violation in checks}
    current = repository.current_environments(session, checked)
    outside = {node for node in checked if current.get(node) not in per_env}
    return _Violations(
        page=[PolicyRow(node=node, env_key=environments[env_id].env_key,
                        **violation.to_dict()) for node, env_id, violation in rows[page]],
        rows=sum(fleet.env_nodes[env_id] * len(found) for env_id, found in per_env.items())
        + len(checks),
        nodes=sum(fleet.env_nodes[env_id] for env_id in per_env) + len(outside))


def _check_violations(session: Session, fleet: Fleet, policy: Policy
                      ) -> list[tuple[str, int, Any]]:
    """The nodes whose latest results break a ``workload.check`` requirement: only the
    outcomes that break one are looked up, node by node."""
    if not policy.required_checks:
        return []
    breaking = {h.outcome.id: h.outcome for h in fleet.held
                if broken_requirements(policy.required_checks, h.outcome.workload,
                                       h.outcome.checks)}
    return check_violations(policy.required_checks, [
        (node, env_id, breaking[outcome_id].workload, breaking[outcome_id].variant,
         breaking[outcome_id].checks)
        for node, env_id, outcome_id in repository.nodes_holding(session, breaking)])
