"""What `numparity-agent explain` found (design §2.11): per result of a reference run, the
setting under which another node gives that run's bits, or the closest one."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Float, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from numparity_server.models.base import Base, BigId, UTCDateTime, utcnow


class Explanation(Base):
    """One finding: node ``node_id`` (on ``local_device``) against one result of run
    ``against_run_pk`` (of node ``against_node_id``, on ``device``).

    ``environment_id`` is the node's environment when the finding arrived (its newest
    run's): once the node's environment changes, the finding may no longer hold, and
    the reads say so (``stale``) instead of showing it as current. The reference run's
    node is copied (``against_node_id``) so findings between two groups of nodes are
    read without the runs table. A run dropped by retention takes its findings with it
    (ON DELETE CASCADE): a finding against a run nobody can read any more explains
    nothing.
    """

    __tablename__ = "explanations"
    __table_args__ = (Index("ix_explanations_key", "suite", "workload", "variant"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id"), index=True)
    environment_id: Mapped[int | None] = mapped_column(ForeignKey("environments.id"))
    against_run_pk: Mapped[int] = mapped_column(
        ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    against_node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id"), index=True)
    # "run": the finding gives the reference result's bits; "eager": the node's compiled
    # result gives the same run's eager (default) answer (design §2.14).
    target: Mapped[str] = mapped_column(String(16), default="run", server_default="run")
    # The reference's result: its key and the device it ran on there.
    suite: Mapped[str] = mapped_column(String(64))
    workload: Mapped[str] = mapped_column(String(128))
    workload_version: Mapped[int | None] = mapped_column(Integer)
    variant: Mapped[str] = mapped_column(String(64))
    device: Mapped[str] = mapped_column(String(64))
    # The explaining node's device.
    local_device: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16))
    label: Mapped[str | None] = mapped_column(Text)
    # {"env": {name: value | null}, "knobs": {name: value}}; NULL when none reproduced it.
    setting: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))
    # {label, setting, matching, tensors, first_differing}: the nearest miss.
    closest: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))
    detail: Mapped[str | None] = mapped_column(Text)
    tried: Mapped[int] = mapped_column(Integer)
    seconds: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)
