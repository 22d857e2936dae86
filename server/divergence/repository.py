"""Queries behind GET /divergence: latest results of a key, and the comparisons kept."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from numparity_server.analysis import Answer
from numparity_server.kit.db import chunked, codepoint_order, lookup
from numparity_server.models import (
    Device,
    Environment,
    Latest,
    LatestCount,
    Manifest,
    Node,
    Outcome,
    stable_identity,
)
from numparity_server.reads.results import run_ids_of_results
from numparity_server.reads.voters import any_crowded, crowded_nodes


def counted_answers(session: Session, *, suite: str, workload: str, variant: str
                    ) -> list[Answer]:
    """The key's latest ok results as ingest counts them (``latest_counts``): one answer
    per (outcome, environment, device model), a few hundred rows however many nodes.
    Without the environments' documents (``reads.environments`` keeps them
    flattened)."""
    rows = session.execute(
        select(LatestCount.outcome_id, LatestCount.environment_id, LatestCount.devices,
               LatestCount.first_node, LatestCount.model, Outcome.device,
               Outcome.workload_version,
               Outcome.input_hash, Outcome.param_hash, Outcome.manifest_hash,
               Outcome.trace_hash, Outcome.repeats_agree)
        .join(Outcome, Outcome.id == LatestCount.outcome_id)
        .where(LatestCount.suite == suite, LatestCount.workload == workload,
               LatestCount.variant == variant, LatestCount.devices > 0,
               Outcome.status == "ok", Outcome.manifest_hash.is_not(None))
    ).all()
    env_keys = lookup(session, Environment.id, Environment.env_key,
                      {row.environment_id for row in rows})
    entries = lookup(session, Manifest.hash, Manifest.entries,
                     {row.manifest_hash for row in rows})
    manifests: dict[str, tuple[tuple[str, str, str], ...]] = {
        digest: tuple((e["name"], e["kind"], e["hash"]) for e in found)
        for digest, found in entries.items()}
    return [
        Answer(outcome=int(row.outcome_id), tensors=manifests[row.manifest_hash],
               manifest=row.manifest_hash,
               env_key=env_keys[row.environment_id], environment={},
               environment_id=int(row.environment_id), devices=int(row.devices),
               first_node=row.first_node, slot=row.device,
               model=row.model or ("cpu" if row.device == "cpu" else "cuda"),
               trace=row.trace_hash, workload_version=row.workload_version,
               input_hash=row.input_hash, param_hash=row.param_hash,
               repeats_agree=row.repeats_agree)
        for row in rows]


def crowded_answers(session: Session, *, suite: str, workload: str, variant: str
                    ) -> list[tuple[int, int, str, str, int]]:
    """The key's latest results on devices without a stable identity (``stable_identity``)
    of the nodes that hold several: (outcome_id, environment_id, model, node name,
    devices). Such a node's devices giving one answer are one voter (design §3.3.12); an
    honest fleet (GPUs known by UUID, one CPU a node) has no such row, and ``latest`` is
    read only for the nodes that may (``reads.voters.crowded_nodes``)."""
    if not any_crowded(session):
        return []
    unstable = (Latest.node_id.in_(crowded_nodes()), Latest.suite == suite,
                Latest.workload == workload, Latest.variant == variant,
                stable_identity() == 0)
    crowded = (select(Latest.node_id).join(Device, Device.id == Latest.device_id)
               .where(*unstable).group_by(Latest.node_id).having(func.count() > 1))
    rows = session.execute(
        select(Latest.outcome_id, Latest.environment_id, Latest.model, Node.name,
               func.count())
        .join(Device, Device.id == Latest.device_id)
        .join(Node, Node.id == Latest.node_id)
        .where(*unstable, Latest.node_id.in_(crowded))
        .group_by(Latest.outcome_id, Latest.environment_id, Latest.model, Node.name)
    ).all()
    return [(int(outcome), int(env), model, node, int(devices))
            for outcome, env, model, node, devices in rows]


@dataclass(frozen=True)
class Listed:
    """A latest result listed as a member: its outcome, environment, node and run."""

    outcome_id: int
    environment_id: int
    node: str
    run_id: str


# An outcome's first members by name are found by walking the nodes in name order until
# the page is full (about page × devices / holders nodes visited, each a look-up in
# latest's unique index) or by ranking the outcome's rows (holders rows, read through the
# index on outcome_id): the walk when it visits fewer, with this weight on a visit.
WALK_COST = 2.0


def first_members(session: Session, *, suite: str, workload: str, variant: str,
                  outcomes: Mapping[int, int], limit: int | None) -> list[Listed]:
    """The latest results of these outcomes of the key (outcome id → how many devices
    hold it), the first ``limit`` of each by node name (code point order; all with None),
    with their run ids: each list costs about its page, not the fleet."""
    devices = sum(outcomes.values())
    walked = sorted(outcome for outcome, holders in outcomes.items()
                    if limit is not None and WALK_COST * limit * devices < holders * holders)
    ranked = sorted(set(outcomes) - set(walked))
    # An outcome is of one key (its hash covers suite, workload and variant): the key's
    # columns are left out of the look-ups, so the planner sees how many rows hold it.
    order = (codepoint_order(session, Node.name), Latest.device_id)
    rows: list[Any] = []
    for part in chunked(ranked):
        rank = func.row_number().over(partition_by=Latest.outcome_id,
                                      order_by=order).label("rank")
        inner = (select(Latest.outcome_id, Latest.environment_id, Latest.result_id,
                        Node.name, rank)
                 .join(Node, Node.id == Latest.node_id)
                 .where(Latest.outcome_id.in_(part))
                 .subquery())
        query = select(inner.c.outcome_id, inner.c.environment_id, inner.c.result_id,
                       inner.c.name)
        if limit is not None:
            query = query.where(inner.c.rank <= limit)
        rows.extend(session.execute(query))
    for outcome in walked:
        rows.extend(session.execute(
            select(Latest.outcome_id, Latest.environment_id, Latest.result_id, Node.name)
            .join(Latest, Latest.node_id == Node.id)
            .where(Latest.outcome_id == outcome)
            .order_by(*order).limit(limit)))
    run_ids = run_ids_of_results(session, [row.result_id for row in rows])
    return [Listed(int(row.outcome_id), int(row.environment_id), row.name,
                   run_ids[row.result_id]) for row in rows]


def outcomes_of_nodes(session: Session, *, suite: str, workload: str, variant: str,
                      nodes: Collection[str]) -> dict[str, set[int]]:
    """node name → the outcomes of its latest results of the key (one a device)."""
    found: dict[str, set[int]] = {}
    for part in chunked(sorted(set(nodes))):
        for name, outcome_id in session.execute(
                select(Node.name, Latest.outcome_id).join(Node, Node.id == Latest.node_id)
                .where(Latest.suite == suite, Latest.workload == workload,
                       Latest.variant == variant, Node.name.in_(part))):
            found.setdefault(name, set()).add(int(outcome_id))
    return found


