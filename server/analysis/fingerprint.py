"""The analysis' view of one tensor fingerprint (design §2.4)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._arrays import canonical_dtype, decode_array


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

    @property
    def count(self) -> int:
        # Python's integers: a stored shape whose int64 product would wrap stays positive.
        return math.prod(self.shape)


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
