"""Pinned answers (goldens, design §3.11): the lab's reference answers for a device model
on an environment or a software stack, versioned.

Every change of a pin's subject (suite, device model, scope) is a new version row: a pin,
a re-pin, an unpin (a version with ``retired``). Nothing is updated in place, so the
history says who pinned what, when and why, and the newest version of a subject is the
one in force (none when it is retired)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Boolean, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from numparity_server.models.base import Base, UTCDateTime, utcnow


class Golden(Base):
    """One version of a pin. ``subject`` is the sha256 of the canonical JSON of (suite,
    model, scope): the versions of one subject share it."""

    __tablename__ = "goldens"
    __table_args__ = (UniqueConstraint("subject", "version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    subject: Mapped[str] = mapped_column(String(64), index=True)
    suite: Mapped[str] = mapped_column(String(64))
    # The device model the answers are of (``devices.model``: ``cpu``, ``cuda/NAME/CC``).
    model: Mapped[str] = mapped_column(String(320))
    # {"env_key": K} (one environment), or promoted attributes → value (a stack).
    scope: Mapped[dict[str, Any]] = mapped_column(JSON)
    version: Mapped[int] = mapped_column(Integer)
    # A version that unpins the subject: it holds no answers.
    retired: Mapped[bool] = mapped_column(Boolean, default=False)
    # "majority", "run" or "unpin"; a run's run_id and device slot.
    source: Mapped[str] = mapped_column(String(16))
    source_run_id: Mapped[str | None] = mapped_column(String(64))
    source_device: Mapped[str | None] = mapped_column(String(64))
    reason: Mapped[str] = mapped_column(Text)
    pinned_by: Mapped[str] = mapped_column(String(255))
    pinned_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class GoldenAnswer(Base):
    """A pinned answer: the whole result (its manifest) of one workload and variant.

    The manifest is a foreign key: retention keeps a pinned manifest, and so its
    fingerprints, however old the runs that reported it (design §3.7)."""

    __tablename__ = "golden_answers"
    __table_args__ = (UniqueConstraint("golden_id", "workload", "variant"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    golden_id: Mapped[int] = mapped_column(ForeignKey("goldens.id", ondelete="CASCADE"))
    workload: Mapped[str] = mapped_column(String(128))
    workload_version: Mapped[int | None] = mapped_column(Integer)
    variant: Mapped[str] = mapped_column(String(64))
    manifest_hash: Mapped[str] = mapped_column(ForeignKey("manifests.hash"), index=True)
    input_hash: Mapped[str | None] = mapped_column(String(64))
    param_hash: Mapped[str | None] = mapped_column(String(64))
    # When pinned: the nodes in scope that gave this answer, of how many gave one (the
    # devices, for pins taken before nodes voted, migration 0020); a run's pin: 1 of 1.
    holders: Mapped[int] = mapped_column(Integer)
    devices: Mapped[int] = mapped_column(Integer)
    # The first holder nodes by name (a pin from the majority; NULL before 0020).
    held_by: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)
