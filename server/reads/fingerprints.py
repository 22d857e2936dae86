"""Stored fingerprints as the pure analysis sees them: blobs decoded to numpy arrays,
whole values left in the database until a comparison reads them, a chunk at a time
(``analysis.StoredValues``, design §2.4). ``/divergence`` and ``/compare`` load theirs
here, in batches."""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable, Iterator, Mapping
from functools import partial
from typing import Any

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from numparity_server import analysis
from numparity_server.kit.db import chunked, release
from numparity_server.models import STAT_FIELDS, Fingerprint

# Whole values stored in at most this many bytes are read with the rest of their
# fingerprint: a comparison of 4,096 small tensors reads them in 16 queries, not 8,192
# (one per tensor and side took seconds). A batch of ``chunked`` hashes then holds at
# most 500 x 16 KiB of them; larger values stay in the database until read, one at a time.
SMALL_VALUES_BYTES = 16 * 1024

# Every column but the large whole values, and whether there are any.
_WITHOUT_VALUES = (*(getattr(Fingerprint, name) for name in (
    "hash", "dtype", "shape", *STAT_FIELDS, "sketch", "sketch_dtype", "sample",
    "sample_dtype", "values_dtype", "values_codec")),
    Fingerprint.values.is_not(None).label("has_values"),
    case((func.length(Fingerprint.values) <= SMALL_VALUES_BYTES, Fingerprint.values),
         else_=None).label("small_values"))


def load_fingerprints(session: Session, hashes: Iterable[str]
                      ) -> dict[str, analysis.Fingerprint]:
    """Hash -> fingerprint of every stored hash among ``hashes`` (unknown ones absent).
    Large whole values are not read: a comparison that needs them reads a fingerprint's
    when it does (and gives the session's connection back after each read); small ones
    (``SMALL_VALUES_BYTES``) come with the rest."""
    found: dict[str, analysis.Fingerprint] = {}
    for part in chunked(sorted(set(hashes))):
        for row in session.execute(select(*_WITHOUT_VALUES).where(Fingerprint.hash.in_(part))):
            found[row.hash] = _without_values(session, row)
    return found


def _without_values(session: Session, row: Any) -> analysis.Fingerprint:
    shape = tuple(int(n) for n in row.shape)
    stats: dict[str, Any] | None = None
    if row.count is not None:
        stats = {field: getattr(row, field) for field in STAT_FIELDS}
    stored = None
    if row.has_values and row.values_dtype is not None:
        read = (partial(_read_values, session, row.hash) if row.small_values is None
                else partial(_held, bytes(row.small_values), row.values_codec))
        stored = analysis.StoredValues(row.values_dtype, math.prod(shape), read)
    return analysis.Fingerprint(
        hash=row.hash, dtype=row.dtype, shape=shape, stats=stats,
        sketch=_decode(row.sketch_dtype, row.sketch),
        sample=_decode(row.sample_dtype, row.sample), stored=stored)


def _read_values(session: Session, digest: str) -> tuple[bytes, str | None]:
    values, codec = session.execute(select(Fingerprint.values, Fingerprint.values_codec)
                                    .where(Fingerprint.hash == digest)).one()
    release(session)  # the bytes are in; the comparison holds no connection
    return bytes(values), codec


def _held(values: bytes, codec: str | None) -> tuple[bytes, str | None]:
    return values, codec


def value_counts(session: Session, hashes: Iterable[str]) -> dict[str, int]:
    """Of these hashes, the fingerprints stored with their whole values, and how many
    elements each holds (no blob read)."""
    found: dict[str, int] = {}
    for part in chunked(sorted(set(hashes))):
        found.update((digest, math.prod(int(n) for n in shape)) for digest, shape in
                     session.execute(select(Fingerprint.hash, Fingerprint.shape).where(
                         Fingerprint.hash.in_(part), Fingerprint.values.is_not(None))))
    return found


def with_values(session: Session, hashes: Iterable[str]) -> set[str]:
    """Of these hashes, the fingerprints stored with their whole values (no blob read)."""
    return set(value_counts(session, hashes))


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


class FingerprintsOnDemand(Mapping[str, analysis.Fingerprint]):
    """Fingerprints read one at a time, when a computation first asks for one (an
    origin's few recorded outputs among a trace's thousands of ops), the connection
    given back after each read. Remembers what was asked: a kept comparison's
    ``awaiting`` and whether everything it read was stored."""

    def __init__(self, session: Session) -> None:
        self._session = session
        self._asked: dict[str, analysis.Fingerprint | None] = {}

    def _get(self, digest: str) -> analysis.Fingerprint | None:
        if digest not in self._asked:
            self._asked[digest] = load_fingerprints(self._session, {digest}).get(digest)
            release(self._session)
        return self._asked[digest]

    def __getitem__(self, digest: str) -> analysis.Fingerprint:
        found = self._get(digest)
        if found is None:
            raise KeyError(digest)
        return found

    def __contains__(self, digest: object) -> bool:
        return isinstance(digest, str) and self._get(digest) is not None

    def __iter__(self) -> Iterator[str]:
        return iter([digest for digest, found in self._asked.items() if found is not None])

    def __len__(self) -> int:
        return sum(found is not None for found in self._asked.values())

    def awaiting(self) -> tuple[str, ...]:
        """The fingerprints asked for that have no whole values."""
        return tuple(sorted(digest for digest, found in self._asked.items()
                            if found is not None and not found.has_values))

    def complete(self) -> bool:
        """Every fingerprint asked for is stored."""
        return all(found is not None for found in self._asked.values())
