"""Queries of the uploads in parts: the parts held, their bytes, the fingerprints they fill."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.orm import Session

from numparity_server.models import STAT_FIELDS, Fingerprint, Token, UploadPart


@dataclass(frozen=True)
class Part:
    id: int
    offset: int
    size: int
    total: int


@dataclass(frozen=True)
class Staged:
    """One unfinished upload of a token: its bytes held and when a part last came."""

    kind: str
    digest: str
    size: int
    last: datetime


def parts(session: Session, *, token_id: int, kind: str, digest: str) -> list[Part]:
    """The upload's parts in order (their bytes stay in the database)."""
    rows = session.execute(
        select(UploadPart.id, UploadPart.offset, UploadPart.size, UploadPart.total)
        .where(UploadPart.token_id == token_id, UploadPart.kind == kind,
               UploadPart.digest == digest)
        .order_by(UploadPart.offset))
    return [Part(*row) for row in rows]


def part_bytes(session: Session, parts: Sequence[Part]) -> Iterator[bytes]:
    """The bytes of each part, one part in memory at a time."""
    for part in parts:
        data = session.scalar(select(UploadPart.data).where(UploadPart.id == part.id))
        yield bytes(data or b"")


def insert_part(session: Session, row: dict[str, Any]) -> None:
    session.execute(insert(UploadPart), [row])


def delete_upload(session: Session, *, token_id: int, kind: str, digest: str) -> None:
    session.execute(delete(UploadPart).where(
        UploadPart.token_id == token_id, UploadPart.kind == kind,
        UploadPart.digest == digest))


def staged(session: Session, token_id: int) -> list[Staged]:
    """The token's unfinished uploads, least recently written first."""
    rows = session.execute(
        select(UploadPart.kind, UploadPart.digest, func.sum(UploadPart.size),
               func.max(UploadPart.received_at))
        .where(UploadPart.token_id == token_id)
        .group_by(UploadPart.kind, UploadPart.digest))
    found = [Staged(kind, digest, int(size or 0), last) for kind, digest, size, last in rows]
    return sorted(found, key=lambda upload: (upload.last, upload.kind, upload.digest))


def delete_stale(session: Session, *, before: datetime) -> None:
    session.execute(delete(UploadPart).where(UploadPart.received_at < before))


def stale_part_ids(session: Session, *, before: datetime, limit: int | None = None
                   ) -> list[int]:
    """Parts received before ``before`` (oldest first; at most ``limit``)."""
    query = (select(UploadPart.id).where(UploadPart.received_at < before)
             .order_by(UploadPart.id))
    return list(session.scalars(query if limit is None else query.limit(limit)))


def delete_parts(session: Session, ids: Sequence[int]) -> int:
    deleted = session.execute(delete(UploadPart).where(UploadPart.id.in_(ids)))
    return int(getattr(deleted, "rowcount", 0) or 0)


def lock_token(session: Session, token_id: int) -> None:
    """Hold the token's row to the end of the transaction: its uploads' writes take
    turns, so the bound on what it holds is read and kept by one at a time (PostgreSQL,
    READ COMMITTED; SQLite's writers take turns already)."""
    session.execute(select(Token.id).where(Token.id == token_id).with_for_update())


@dataclass(frozen=True)
class ValuesTarget:
    """A stored fingerprint whose values may be sent: its dtype and shape, and whether
    the server holds the values already."""

    dtype: str
    shape: list[int]
    held: bool


def values_target(session: Session, digest: str) -> ValuesTarget | None:
    row = session.execute(
        select(Fingerprint.dtype, Fingerprint.shape, Fingerprint.values.is_not(None))
        .where(Fingerprint.hash == digest)).first()
    return None if row is None else ValuesTarget(row[0], list(row[1]), bool(row[2]))


def fill_values(session: Session, *, digest: str, values: bytes | bytearray, dtype: str,
                codec: str | None, stats: Mapping[str, Any]) -> None:
    """Set the values of a fingerprint that has none (the first complete upload wins),
    and the statistics computed from them."""
    session.execute(
        update(Fingerprint)
        .where(Fingerprint.hash == digest, Fingerprint.values.is_(None))
        .values(values=values, values_dtype=dtype, values_codec=codec,
                **{field: stats[field] for field in STAT_FIELDS}))
