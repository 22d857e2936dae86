"""Queries behind the dashboard's pages that the API's services do not already answer."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from numparity_server.kit.db import chunked, codepoint_order
from numparity_server.models import Device, Latest, LatestCount, Node, Outcome, Result, Run


@dataclass(frozen=True)
class Cell:
    """One device's newest result of one (suite, workload, variant) on a node."""

    node: str
    device_id: int
    slot: str  # where the result ran on the node: cuda:3, cpu
    model: str  # devices.model: cpu, or type/name/compute capability
    device_name: str | None
    device_uuid: str | None
    suite: str
    workload: str
    variant: str
    status: str
    reason: str | None
    error: str | None
    manifest_hash: str | None
    input_hash: str | None
    param_hash: str | None
    run_id: str
    started_at: datetime


def answer_counts(session: Session, *, suite: str) -> list[tuple[str, str, str, str, int, str]]:
    """The fleet's answers: (workload, variant, device model, manifest hash, devices,
    first node name) of the newest ok results, one row per distinct answer (a few
    hundred rows however many nodes). A node's eight identical GPUs count eight."""
    rows = session.execute(
        select(Outcome.workload, Outcome.variant, LatestCount.model, Outcome.manifest_hash,
               func.sum(LatestCount.devices),
               func.min(codepoint_order(session, LatestCount.first_node)))
        .select_from(LatestCount)
        .join(Outcome, Outcome.id == LatestCount.outcome_id)
        .where(LatestCount.suite == suite, LatestCount.devices > 0, Outcome.status == "ok",
               Outcome.manifest_hash.is_not(None))
        .group_by(Outcome.workload, Outcome.variant, LatestCount.model,
                  Outcome.manifest_hash)
    ).all()
    return [tuple(row) for row in rows]  # type: ignore[misc]


def node_names(session: Session, *, suite: str, limit: int, offset: int
               ) -> tuple[list[str], int]:
    """A page of the names of the nodes with a newest result in ``suite``, and how many.

    Both walk ``nodes`` and ask ``latest`` only whether the node has a row (its unique
    key leads with ``node_id``): the page stops after ``offset + limit`` names in name
    order, instead of collecting the distinct nodes of every latest result first (36 a
    node) — at 100,000 nodes that was most of the fleet page's time."""
    held = (select(Latest.id).where(Latest.node_id == Node.id, Latest.suite == suite)
            .exists())
    total = session.scalar(select(func.count()).select_from(Node).where(held)) or 0
    names = session.scalars(
        select(Node.name).where(held).order_by(Node.name).limit(limit).offset(offset)
    ).all()
    return list(names), total


def latest_cells(session: Session, *, suite: str, nodes: Collection[str]) -> list[Cell]:
    """The newest result of every key of ``suite`` of each device of these nodes."""
    found: list[Cell] = []
    for part in chunked(sorted(set(nodes))):
        rows = session.execute(
            select(Node.name.label("node"), Latest.device_id, Outcome.device.label("slot"),
                   Device.model, Device.name.label("device_name"),
                   Device.uuid.label("device_uuid"), Outcome.suite, Outcome.workload,
                   Outcome.variant, Outcome.status, Outcome.reason, Outcome.error,
                   Outcome.manifest_hash, Outcome.input_hash, Outcome.param_hash,
                   Run.run_id, Latest.started_at)
            .select_from(Latest)
            .join(Outcome, Outcome.id == Latest.outcome_id)
            .join(Result, Result.id == Latest.result_id)
            .join(Run, Run.id == Result.run_pk)
            .join(Node, Node.id == Latest.node_id)
            .join(Device, Device.id == Latest.device_id)
            .where(Latest.suite == suite, Node.name.in_(part))
        ).all()
        found.extend(Cell(**row._mapping) for row in rows)
    return found


def columns(session: Session, *, suite: str) -> list[tuple[str, str]]:
    """Every (workload, variant) of ``suite`` some node has a newest result of that ran:
    a column every node skipped (``data`` under the variants it does not run in, by
    design) would be a column of ``skipped`` cells."""
    rows = session.execute(
        select(LatestCount.workload, LatestCount.variant)
        .join(Outcome, Outcome.id == LatestCount.outcome_id)
        .where(LatestCount.suite == suite, LatestCount.devices > 0,
               Outcome.status != "skipped").distinct())
    return [(workload, variant) for workload, variant in rows]


def workload_variants(session: Session, *, suite: str, workload: str) -> list[str]:
    """The variants of ``workload`` some node has a newest result of."""
    return list(session.scalars(
        select(LatestCount.variant)
        .where(LatestCount.suite == suite, LatestCount.workload == workload,
               LatestCount.devices > 0)
        .distinct()
    ))

