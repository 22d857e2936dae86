"""Runs, their results, and the newest result per (node, suite, workload, variant)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from numparity_server.models.base import Base, BigId, UTCDateTime, utcnow


class Run(Base):
    __tablename__ = "runs"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    run_id: Mapped[str] = mapped_column(String(64), unique=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id"), index=True)
    environment_id: Mapped[int] = mapped_column(ForeignKey("environments.id"), index=True)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    agent_version: Mapped[str | None] = mapped_column(String(64))
    # sha256 of the canonical JSON of the document: an identical re-upload is a no-op.
    document_sha256: Mapped[str] = mapped_column(String(64))
    drill: Mapped[bool] = mapped_column(Boolean, default=False)
    received_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)
    # The GPUs' NVML readings at the run's start and end, by slot (design §2.7 `devices[]
    # .telemetry`, issue 44): {slot: {"uuid", "start", "end"}}; NULL when none had any.
    telemetry: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True),
                                                            nullable=True)


class Outcome(Base):
    """What a result says, content-addressed like fingerprints and manifests (design §3.1).

    Everything about a result but its timing is the same on every node of an environment
    and in every run of a node that does not change, so it is stored once per ``hash``
    (sha256 of its canonical JSON) and a run's results cost a few bytes each (design §4:
    a run on a known environment adds result rows and a few KiB).
    """

    __tablename__ = "outcomes"
    __table_args__ = (Index("ix_outcomes_key", "suite", "workload", "variant"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    hash: Mapped[str] = mapped_column(String(64), unique=True)
    suite: Mapped[str] = mapped_column(String(64))
    workload: Mapped[str] = mapped_column(String(128))
    workload_version: Mapped[int | None] = mapped_column(Integer)
    variant: Mapped[str] = mapped_column(String(64))
    device: Mapped[str] = mapped_column(String(64), default="")
    status: Mapped[str] = mapped_column(String(16), index=True)
    reason: Mapped[str | None] = mapped_column(Text)
    error: Mapped[str | None] = mapped_column(Text)
    input_hash: Mapped[str | None] = mapped_column(String(128))
    param_hash: Mapped[str | None] = mapped_column(String(128))
    manifest_hash: Mapped[str | None] = mapped_column(ForeignKey("manifests.hash"), index=True)
    repeats: Mapped[int | None] = mapped_column(Integer)
    repeats_agree: Mapped[bool | None] = mapped_column(Boolean)
    knobs: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # The result's op trace (traces.hash), when the agent traced it (design §3.1); the
    # outcome hash covers it only when set, so outcomes without one kept their hashes.
    trace_hash: Mapped[str | None] = mapped_column(ForeignKey("traces.hash"), index=True)
    # Self-consistency checks by name (decoder's "batch_invariant", ...: design §2.2),
    # each {"equal", "max_ulp", "max_rel", "op", ...}; covered by the hash only when set.
    checks: Mapped[dict[str, Any] | None] = mapped_column(JSON)


class Result(Base):
    """One (workload, variant) of a run: its outcome and what only this run has, its time."""

    __tablename__ = "results"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    # The integer key of the run (runs.id); runs.run_id is the agent's UUID of it.
    run_pk: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    outcome_id: Mapped[int] = mapped_column(ForeignKey("outcomes.id"), index=True)
    wall_s: Mapped[float | None] = mapped_column(Float)
    # Half the range of the timed repeats' wall times (None below two timed repeats).
    wall_s_spread: Mapped[float | None] = mapped_column(Float)
    # The device it ran on (devices.id): suspects and history follow the device.
    device_id: Mapped[int | None] = mapped_column(ForeignKey("devices.id"), index=True)
    # A result whose repeats disagree: its nondeterministic ops and the cost study of
    # making only them deterministic (design §2.13). Timings, so on the result, not its
    # outcome; only nondeterministic results have one.
    nondeterminism: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # A compiled result's record (design §2.14): {"compile": {passes (the first 16),
    # pass_count, cold_s, warm_s, …}, "localisation": {module, kernels, note, …}}.
    # Timings, so on the result; NULL for every other result.
    compiled: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True),
                                                            nullable=True)


class Latest(Base):
    """The newest result of each device of each node per key, kept current on ingest (by
    ``started_at``, so a spooled run uploaded late does not hide a newer one).

    It also carries copies of what the fleet-wide analysis reads of that result (its
    outcome, the run's environment, the wall time), so /audit and /divergence aggregate
    this one table instead of joining 10,000 nodes' results and runs. The copies change
    only with ``result_id``; an outcome cannot go while its result refers to it, and the
    row goes with the result, so ``outcome_id`` needs no foreign key.

    ``outcome_id`` is indexed all the same, with ``environment_id``, for /audit's "who
    holds this answer in that environment" and /divergence's members (migrations 0013,
    0014). That keeps uploads' updates HOT: PostgreSQL compares an indexed column's old
    and new values, and the two change only when the node's answer for the key or its
    environment does, which a node that keeps both never does.
    """

    __tablename__ = "latest"
    __table_args__ = (
        UniqueConstraint("node_id", "device_id", "suite", "workload", "variant"),
        Index("ix_latest_key", "suite", "workload", "variant"),
        Index("ix_latest_outcome_id_environment_id", "outcome_id", "environment_id"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id"))
    # The device (devices.id): a node with 8 GPUs holds 8 latest results per key.
    device_id: Mapped[int] = mapped_column(ForeignKey("devices.id"))
    suite: Mapped[str] = mapped_column(String(64))
    workload: Mapped[str] = mapped_column(String(128))
    variant: Mapped[str] = mapped_column(String(64))
    # No foreign key and no index: every upload moves 36 rows' result_id, and an index on
    # it would make every one of those updates write a new index entry in each index of
    # the table (PostgreSQL's HOT updates need no indexed column to change; the table
    # has fillfactor 70 there so the new row versions fit on their page). Only
    # retention deletes results, and it never deletes a run that holds a latest result.
    result_id: Mapped[int] = mapped_column(BigId)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime)
    outcome_id: Mapped[int] = mapped_column(BigId)
    environment_id: Mapped[int] = mapped_column(ForeignKey("environments.id"))
    # The device's model when this result ran (devices.model then): what makes devices
    # peers, and the key of ``latest_counts`` (migration 0014).
    model: Mapped[str] = mapped_column(String(320))
    wall_s: Mapped[float | None] = mapped_column(Float)
    wall_s_spread: Mapped[float | None] = mapped_column(Float)


class LatestCount(Base):
    """``latest`` counted by (environment, outcome, device model): how many latest rows
    hold each, the first of their nodes by name (code point order: consensus's tie-break)
    and the sums the audit's cost of determinism reads. Ingest keeps it in step with
    ``latest`` in the same transaction (``runs.counts``), so the fleet-wide reads (the
    audit, /metrics, the dashboard, /divergence's groups) read a few hundred rows, not a
    row per node and key (design §3.1). A count that fell to 0 stays, with
    ``first_node`` NULL; readers ask for ``devices > 0``."""

    __tablename__ = "latest_counts"
    __table_args__ = (
        UniqueConstraint("environment_id", "outcome_id", "model"),
        Index("ix_latest_counts_key", "suite", "workload", "variant"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    environment_id: Mapped[int] = mapped_column(ForeignKey("environments.id"))
    outcome_id: Mapped[int] = mapped_column(BigId)
    model: Mapped[str] = mapped_column(String(320))
    suite: Mapped[str] = mapped_column(String(64))
    workload: Mapped[str] = mapped_column(String(128))
    variant: Mapped[str] = mapped_column(String(64))
    devices: Mapped[int] = mapped_column(Integer)
    first_node: Mapped[str | None] = mapped_column(String(255))
    wall_sum: Mapped[float] = mapped_column(Float)
    wall_sq_sum: Mapped[float] = mapped_column(Float)
    walls: Mapped[int] = mapped_column(Integer)
    spread_sum: Mapped[float] = mapped_column(Float)
    spreads: Mapped[int] = mapped_column(Integer)
