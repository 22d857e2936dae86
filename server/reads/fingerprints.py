"""Stored fingerprints as the pure analysis sees them: blobs decoded to
numpy arrays, whole values decompressed (design §2.4). ``/divergence`` and ``/compare`` load theirs
here, in one batch per request."""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from numparity_server import analysis
from numparity_server.kit.db import chunked
from numparity_server.models import STAT_FIELDS, Fingerprint


def load_fingerprints(session: Session, hashes: Iterable[str]
                      ) -> dict[str, analysis.Fingerprint]:
    """Hash -> fingerprint of every stored hash among ``hashes`` (unknown ones absent)."""
    rows: list[Fingerprint] = []
    for part in chunked(sorted(set(hashes))):
        rows.extend(session.scalars(select(Fingerprint).where(Fingerprint.hash.in_(part))))
    return {row.hash: to_analysis(row) for row in rows}


def with_values(session: Session, hashes: Iterable[str]) -> set[str]:
    """Of these hashes, the fingerprints stored with their whole values (no blob read)."""
    found: set[str] = set()
    for part in chunked(sorted(set(hashes))):
        found.update(session.scalars(select(Fingerprint.hash).where(
            Fingerprint.hash.in_(part), Fingerprint.values.is_not(None))))
    return found


def to_analysis(row: Fingerprint) -> analysis.Fingerprint:
    """The stored row as the analysis sees it: blobs decoded to numpy arrays."""
    shape = tuple(int(n) for n in row.shape)
    stats: dict[str, Any] | None = None
    if row.count is not None:
        stats = {field: getattr(row, field) for field in STAT_FIELDS}
    return analysis.Fingerprint(
        hash=row.hash, dtype=row.dtype, shape=shape, stats=stats,
        sketch=_decode(row.sketch_dtype, row.sketch),
        sample=_decode(row.sample_dtype, row.sample),
        values=_decode(row.values_dtype, _values_bytes(row), shape),
    )


def _values_bytes(row: Fingerprint) -> bytes | None:
    if row.values is not None and row.values_codec == "zlib":
        return zlib.decompress(row.values)
    return row.values


def _decode(dtype: str | None, raw: bytes | None, shape: tuple[int, ...] | None = None
            ) -> Any:
    if raw is None or dtype is None:
        return None
    return analysis.decode_array(dtype, bytes(raw), shape)
