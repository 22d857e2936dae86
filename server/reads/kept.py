"""Comparisons kept by content (design §3.1, §3.3.7): /divergence's pairs, origins and fp64
judgements and /compare's result pairs, each computed once under the key of what it read
(``analysis.pairs``) and read back by key."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, select, update
from sqlalchemy.orm import Session

from numparity_server.analysis import ComparisonRecord
from numparity_server.kit.db import chunked, insert_ignoring_conflicts
from numparity_server.models import KeptComparison, utcnow
from numparity_server.reads.fingerprints import with_values


@dataclass(frozen=True)
class Kept:
    value: dict[str, Any]
    awaiting: list[str]  # fingerprints it read without their whole values


def kept_comparisons(session: Session, keys: Collection[str]) -> dict[str, Kept]:
    """The comparisons kept under these keys (one query per 500)."""
    found: dict[str, Kept] = {}
    for part in chunked(sorted(keys)):
        for key, value, awaiting in session.execute(
                select(KeptComparison.key, KeptComparison.value, KeptComparison.awaiting)
                .where(KeptComparison.key.in_(part))):
            found[key] = Kept(value, awaiting)
    return found


def keep_comparisons(session: Session, records: Sequence[ComparisonRecord], *,
                     refreshed: Collection[str] = ()) -> None:
    """Store new comparisons, and replace those in ``refreshed`` (computed again once the
    values they lacked arrived).

    Two requests computing the same key both insert it: ON CONFLICT DO NOTHING keeps the
    first (they computed the same content), on SQLite and PostgreSQL alike; keys go in
    sorted, so concurrent inserts lock in one order.
    """
    now = utcnow()
    rows = sorted(({"key": r.key, "kind": r.kind, "hash_a": r.hash_a, "hash_b": r.hash_b,
                    "value": r.value, "awaiting": list(r.awaiting), "created_at": now}
                   for r in records), key=lambda row: row["key"])
    fresh = [row for row in rows if row["key"] not in refreshed]
    insert_ignoring_conflicts(session, KeptComparison.__table__, fresh, keys=["key"])
    again = [{"k": row["key"], "v": row["value"], "w": row["awaiting"], "t": now}
             for row in rows if row["key"] in refreshed]
    if again:
        session.execute(
            update(KeptComparison.__table__)
            .where(KeptComparison.__table__.c.key == bindparam("k"))
            .values(value=bindparam("v"), awaiting=bindparam("w"), created_at=bindparam("t")),
            again)


def usable_comparisons(session: Session, keys: Collection[str]
                       ) -> tuple[dict[str, dict[str, Any]], set[str]]:
    """The kept comparisons of ``keys`` still good, by key, and the keys kept but stale:
    some fingerprint they read without its whole values has them now (compute those
    again, and keep them with ``refreshed``)."""
    kept = kept_comparisons(session, keys)
    awaited = {digest for found in kept.values() for digest in found.awaiting}
    arrived = with_values(session, awaited) if awaited else set()
    stale = {key for key, found in kept.items() if arrived.intersection(found.awaiting)}
    return {key: found.value for key, found in kept.items() if key not in stale}, stale
