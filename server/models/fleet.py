"""Nodes and the environments they run in."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Boolean, ForeignKey, Integer, String, case
from sqlalchemy.orm import Mapped, mapped_column

from numparity_server.models.base import Base, UTCDateTime, utcnow


class Node(Base):
    __tablename__ = "nodes"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    # Code point order on PostgreSQL too ("C"), as Python and SQLite compare names: the
    # unique index then serves "the first nodes by name" (/divergence's members, the
    # fleet page) without a sort of every node.
    name: Mapped[str] = mapped_column(
        String(255).with_variant(String(255, collation="C"), "postgresql"), unique=True)
    labels: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    first_seen: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_seen: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)
    # The environment of the node's newest run (by started_at), and when a newer run
    # last came on another environment than the run before it: /audit reads the current
    # environment from here and looks for drift only on nodes that changed.
    environment_id: Mapped[int | None] = mapped_column(ForeignKey("environments.id"))
    newest_started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    environment_changed_at: Mapped[datetime | None] = mapped_column(UTCDateTime, index=True)


class Environment(Base):
    """One row per ``env_key``: the attributes that determine numerics (design §2.5).

    The promoted columns are what inventories and filters read; ``document`` keeps the
    whole environment document as the first node reported it.
    """

    __tablename__ = "environments"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    env_key: Mapped[str] = mapped_column(String(64), unique=True)
    gpu_name: Mapped[str | None] = mapped_column(String(255), index=True)
    compute_capability: Mapped[str | None] = mapped_column(String(16))
    driver: Mapped[str | None] = mapped_column(String(64), index=True)
    cuda: Mapped[str | None] = mapped_column(String(64), index=True)
    cudnn: Mapped[str | None] = mapped_column(String(64))
    torch: Mapped[str | None] = mapped_column(String(64), index=True)
    cpu_capability: Mapped[str | None] = mapped_column(String(64))
    cpu_model: Mapped[str | None] = mapped_column(String(255))
    document: Mapped[dict[str, Any]] = mapped_column(JSON)
    first_seen: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


def stable_identity() -> Any:
    """1 for a device known by a UUID or serial (each a voter, design §3.3.12), 0 for one
    known by its slot on its node or claiming another node's device (all of a node's
    such devices together one voter): the SQL every voter count reads."""
    return case((Device.identity.like("uuid:%") | Device.identity.like("serial:%"), 1),
                else_=0)


class Device(Base):
    """One device a node runs the suite on (design §3.1): a GPU (or MIG instance) known
    by its UUID wherever it sits, or a node's CPU.

    ``identity`` is what follows the device: ``uuid:<UUID>`` when the agent read one;
    else ``serial:<serial>`` (a board's serial, not for MIG instances); else the slot on
    its node, ``node:<node id>/<slot>``. A GPU moved to another node keeps its row and
    its history; ``node_id`` and ``slot`` say where it sits now (the node of its newest
    run; NULL once that node's newest run no longer lists it). ``model`` is the device's
    name and compute capability (``cpu`` for a CPU): devices of one model on one
    environment are peers in the audit, within a node and across nodes.
    """

    __tablename__ = "devices"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    identity: Mapped[str] = mapped_column(String(320), unique=True)
    type: Mapped[str] = mapped_column(String(16))
    model: Mapped[str] = mapped_column(String(320))
    uuid: Mapped[str | None] = mapped_column(String(128), index=True)
    serial: Mapped[str | None] = mapped_column(String(128), index=True)
    pci_bus_id: Mapped[str | None] = mapped_column(String(64))
    name: Mapped[str | None] = mapped_column(String(255))
    compute_capability: Mapped[str | None] = mapped_column(String(16))
    mig: Mapped[bool] = mapped_column(Boolean, default=False)
    node_id: Mapped[int | None] = mapped_column(ForeignKey("nodes.id"), index=True)
    slot: Mapped[str] = mapped_column(String(64))
    first_seen: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_seen: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    # The order time of the newest run that used it (what decides where it sits).
    newest_started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # When a newer run last showed it on another node than before: /audit reads the
    # runs of devices that moved within its window for drift.
    moved_at: Mapped[datetime | None] = mapped_column(UTCDateTime, index=True)
    # The node the device belongs to: the first to report it (a UUID or serial), until an
    # admin moves it (`numparity-server device move`). NULL: no node holds it yet.
    owner_node_id: Mapped[int | None] = mapped_column(ForeignKey("nodes.id"), index=True)
    # A claim: another node reported a device that belongs to a node other than it. The
    # claiming node's results of it are kept on this row, a device of the claiming node,
    # and never on the owned device's history, until an admin confirms the move.
    claim_of: Mapped[int | None] = mapped_column(ForeignKey("devices.id"), index=True)
