"""Parts of uploads that did not fit one request body (design §3.2, "uploads in parts")."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Index, Integer, LargeBinary, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from numparity_server.models.base import Base, BigId, UTCDateTime, utcnow


class UploadPart(Base):
    """One part of an unfinished upload: bytes ``offset`` to ``offset + size`` of a whole
    of ``total`` bytes, named by ``kind`` ("document": the gzip of a run document, named
    by its sha256; "values": a large tensor's values, named by the tensor's hash).

    Parts belong to the token that sent them (``token_id``): another token can neither
    add to nor spoil an upload. Each part continues the bytes held, so an upload's parts
    tile ``0..received`` without gaps or overlaps; the whole is checked against its name
    when it is complete, then stored where it belongs and its parts deleted.
    """

    __tablename__ = "upload_parts"
    __table_args__ = (
        UniqueConstraint("token_id", "kind", "digest", "offset"),
        Index("ix_upload_parts_received_at", "received_at"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    token_id: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(16))
    digest: Mapped[str] = mapped_column(String(64))
    offset: Mapped[int] = mapped_column(BigInteger)
    size: Mapped[int] = mapped_column(Integer)
    total: Mapped[int] = mapped_column(BigInteger)
    data: Mapped[bytes] = mapped_column(LargeBinary)
    received_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
