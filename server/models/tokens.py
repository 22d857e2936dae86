"""API tokens: only their sha256 is stored; the token itself is shown once."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from numparity_server.models.base import Base, UTCDateTime, utcnow


class Token(Base):
    __tablename__ = "tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    sha256: Mapped[str] = mapped_column(String(64), unique=True)
    role: Mapped[str] = mapped_column(String(16))
    label: Mapped[str] = mapped_column(String(255), default="")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # The nodes an agent token may write runs for (design §3.6): exact names and
    # shell-style patterns. Both NULL: an unbound token, which writes any node. On the
    # token's row, so that authentication stays one look-up by ``sha256``.
    node_names: Mapped[list[str] | None] = mapped_column(JSON(none_as_null=True))
    node_patterns: Mapped[list[str] | None] = mapped_column(JSON(none_as_null=True))
