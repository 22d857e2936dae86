"""The analysis' view of one tensor fingerprint (design §2.4)."""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._arrays import canonical_dtype, decode_array, itemsize

# Elements a stored tensor's values are decoded in at once (design §3.3: "streaming"):
# 256 KiB of float32, so a comparison's memory is two chunks, whatever the tensor's size.
CHUNK = 1 << 16


@dataclass(frozen=True)
class StoredValues:
    """A tensor's whole values as stored (raw little-endian bytes, or their zlib), read
    only when a comparison needs them, and decoded a chunk at a time: comparing two
    tensors of 5.5 million elements holds their stored bytes and a chunk of each, never
    the decoded arrays (24 of them decoded at once took 970 MB)."""

    dtype: str  # the wire dtype of the bytes
    count: int  # elements
    read: Callable[[], tuple[bytes, str | None]]  # (the stored bytes, their codec)

    def chunks(self, elements: int = CHUNK) -> Iterator[np.ndarray]:
        """Flat arrays of ``elements`` elements (the last one shorter), in order."""
        blob, codec = self.read()
        step = elements * itemsize(self.dtype)
        pieces = _raw_pieces(blob, step) if codec is None else _inflated_pieces(blob, step)
        seen = 0
        for piece in pieces:
            chunk = decode_array(self.dtype, piece)
            seen += chunk.size
            yield chunk
        if seen != self.count:
            raise ValueError(f"stored values hold {seen} elements, not {self.count}")

    def array(self) -> np.ndarray:
        """The whole values, flat (for the few uses that need them at once)."""
        parts = list(self.chunks())
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.float32)


def _raw_pieces(blob: bytes, step: int) -> Iterator[bytes]:
    view = memoryview(blob)
    for start in range(0, len(view), step):
        yield bytes(view[start:start + step])


def _inflated_pieces(blob: bytes, step: int) -> Iterator[bytes]:
    """The zlib stream's bytes, ``step`` at a time (zlib never writes more than asked)."""
    inflater = zlib.decompressobj()
    pending = bytearray()
    tail = blob
    while True:
        pending += inflater.decompress(tail, step)
        tail = inflater.unconsumed_tail
        while len(pending) >= step:
            yield bytes(pending[:step])
            del pending[:step]
        if not tail:
            break
    pending += inflater.flush()
    for start in range(0, len(pending), step):
        yield bytes(pending[start:start + step])


@dataclass(frozen=True)
class Fingerprint:
    """A decoded fingerprint. Arrays are native numpy (bfloat16 values held as float32)."""

    hash: str
    dtype: str
    shape: tuple[int, ...]
    stats: dict | None = None
    sketch: np.ndarray | None = None
    sample: np.ndarray | None = None
    values: np.ndarray | None = None
    # The whole values as stored, read when needed (the server's fingerprints): either
    # this or ``values``, never both.
    stored: StoredValues | None = None

    @property
    def count(self) -> int:
        # Python's integers: a stored shape whose int64 product would wrap stays positive.
        return math.prod(self.shape)

    @property
    def has_values(self) -> bool:
        return self.values is not None or self.stored is not None

    def value_chunks(self, elements: int = CHUNK) -> Iterator[np.ndarray]:
        """The whole values, flat, ``elements`` at a time (nothing without them)."""
        if self.stored is not None:
            yield from self.stored.chunks(elements)
        elif self.values is not None:
            flat = np.ravel(self.values)
            for start in range(0, flat.size, elements):
                yield flat[start:start + elements]

    def whole_values(self) -> np.ndarray | None:
        """The whole values in their shape, decoded at once (None without them)."""
        if self.stored is not None:
            return self.stored.array().reshape(self.shape)
        return self.values


def _decode_field(entry: Mapping[str, Any], field: str, default_dtype: str,
                  length_key: str | None, shape: tuple[int, ...] | None) -> np.ndarray | None:
    wire = entry.get(field)
    if wire is None:
        return None
    if not isinstance(wire, Mapping) or "data" not in wire:
        raise ValueError(f"{field}: expected an object with 'dtype' and 'data'")
    try:
        array = decode_array(wire.get("dtype", default_dtype), wire["data"], shape)
    except ValueError as exc:
        raise ValueError(f"{field}: {exc}") from None
    if length_key is not None and length_key in wire and int(wire[length_key]) != array.size:
        raise ValueError(f"{field}: {length_key}={wire[length_key]} but data holds {array.size}")
    return array


def fingerprint_from_wire(entry: Mapping[str, Any]) -> Fingerprint:
    """A full §2.4 tensor entry (``hash``, ``dtype``, ``shape`` and optional parts)."""
    try:
        digest, dtype, shape = entry["hash"], entry["dtype"], entry["shape"]
    except KeyError as exc:
        raise ValueError(f"fingerprint entry lacks {exc.args[0]!r}") from None
    dtype = canonical_dtype(dtype)
    shape = tuple(int(n) for n in shape)
    stats = entry.get("stats")
    return Fingerprint(
        hash=str(digest),
        dtype=dtype,
        shape=shape,
        stats=dict(stats) if stats is not None else None,
        sketch=_decode_field(entry, "sketch", "float64", "k", None),
        sample=_decode_field(entry, "sample", dtype, "m", None),
        values=_decode_field(entry, "values", dtype, None, shape),
    )
