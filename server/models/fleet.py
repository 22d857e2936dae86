"""Nodes and the environments they run in."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, ForeignKey, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from numparity_server.models.base import Base, UTCDateTime, utcnow


class Node(Base):
    __tablename__ = "nodes"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(255), unique=True)
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
