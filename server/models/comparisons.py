"""Computed comparisons kept by content (design §3.1, §3.3.7): what /divergence compared
once it never compares again."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, String
from sqlalchemy.orm import Mapped, mapped_column

from numparity_server.models.base import Base, UTCDateTime, utcnow


class KeptComparison(Base):
    """One comparison (``analysis.pairs``): two answers (``pair``), two representatives'
    origin ops (``origin``) or a group's fp64 judgement (``fp64``), under the sha256 of
    everything it read (``key``).

    ``hash_a``/``hash_b`` are the first content the key names (answers, op traces, the
    group's tensor and the float64 answer's): retention drops a row once either is no
    longer stored. ``awaiting``: the fingerprints it read without their whole values;
    when one of them has its values, the comparison is computed again and the row
    replaced. No foreign keys: a row names manifests, fingerprints or traces by kind,
    and a dead row is only never read.
    """

    __tablename__ = "comparisons"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    kind: Mapped[str] = mapped_column(String(8))
    hash_a: Mapped[str] = mapped_column(String(64))
    hash_b: Mapped[str] = mapped_column(String(64))
    value: Mapped[dict[str, Any]] = mapped_column(JSON)
    awaiting: Mapped[list[str]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)
