"""Queries of the node views."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from numparity_server.kit.db import chunked, lookup
from numparity_server.models import Device, Environment, Node, Run


def count_nodes(session: Session) -> int:
    return session.scalar(select(func.count()).select_from(Node)) or 0


def nodes_page(session: Session, *, limit: int, offset: int) -> Sequence[Node]:
    return session.scalars(select(Node).order_by(Node.name).limit(limit).offset(offset)).all()


def run_counts(session: Session, node_ids: Sequence[int]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for part in chunked(node_ids):
        counts.update((key, value) for key, value in session.execute(
            select(Run.node_id, func.count()).where(Run.node_id.in_(part)).group_by(Run.node_id)
        ))
    return counts


def env_keys(session: Session, environment_ids: Sequence[int | None]) -> dict[int, str]:
    return lookup(session, Environment.id, Environment.env_key,
                  [env_id for env_id in environment_ids if env_id is not None])

def find_node(session: Session, name: str) -> Node | None:
    return session.scalar(select(Node).where(Node.name == name))


def count_runs(session: Session, node_id: int) -> int:
    return session.scalar(select(func.count()).select_from(Run).where(Run.node_id == node_id)) or 0


def timeline_runs(session: Session, node_id: int, *, limit: int, offset: int) -> Sequence[Any]:
    """Runs of a node, newest first, with their env_key."""
    return session.execute(
        select(Run.id, Run.run_id, Run.started_at, Run.received_at, Run.agent_version,
               Run.drill, Environment.env_key)
        .join(Environment, Environment.id == Run.environment_id)
        .where(Run.node_id == node_id)
        .order_by(Run.started_at.desc(), Run.id.desc())
        .limit(limit).offset(offset)
    ).all()




def newest_telemetry(session: Session, node_id: int) -> Any:
    """(run_id, started_at, telemetry) of the node's newest run that recorded GPU
    readings, or None."""
    return session.execute(
        select(Run.run_id, Run.started_at, Run.telemetry)
        .where(Run.node_id == node_id, Run.telemetry.is_not(None))
        .order_by(Run.started_at.desc(), Run.id.desc()).limit(1)
    ).first()


def environment_documents(session: Session, env_keys: Sequence[str]) -> dict[str, Any]:
    return lookup(session, Environment.env_key, Environment.document, env_keys)


def devices(session: Session, node_id: int) -> Sequence[Any]:
    """The devices sitting on the node now, by slot (cuda:2 before cuda:10)."""
    rows = session.execute(
        select(Device.slot.label("device"), Device.type, Device.model, Device.uuid,
               Device.serial, Device.pci_bus_id, Device.name, Device.compute_capability,
               Device.mig, Device.first_seen, Device.last_seen)
        .where(Device.node_id == node_id)
    ).all()

    def order(row: Any) -> tuple[str, int, str]:
        kind, _, index = row.device.partition(":")
        return kind, int(index) if index.isdigit() else -1, row.device

    return sorted(rows, key=order)
