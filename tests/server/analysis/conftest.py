"""A test-local fingerprinter, written from design §2.4 independently of the agent.

It produces full wire entries (hash, stats, sketch, sample, values) so the tests go
through ``fingerprint_from_wire`` as the server does.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from numparity_server.analysis import Fingerprint, fingerprint_from_wire

K = 256
M = 64
_MASK = np.uint64(0xFFFFFFFFFFFFFFFF)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser over uint64 (numpy wraps on overflow, as C does)."""
    with np.errstate(over="ignore"):
        z = (x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)) & _MASK
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def count_sketch(values: np.ndarray, k: int = K) -> np.ndarray:
    """Element i → bucket h(i) with sign s(i), both from the integer hash of i."""
    flat = np.ravel(values).astype(np.float64)
    h = splitmix64(np.arange(flat.size, dtype=np.uint64))
    buckets = (h % np.uint64(k)).astype(np.int64)
    signs = np.where((h >> np.uint64(63)) == 1, -1.0, 1.0)
    return np.bincount(buckets, weights=signs * flat, minlength=k)


def sample_positions(numel: int, m: int = M) -> np.ndarray:
    return (splitmix64(np.arange(m, dtype=np.uint64) + np.uint64(1 << 40))
            % np.uint64(numel)).astype(np.int64)


def _wire_bytes(values: np.ndarray, dtype: str) -> bytes:
    if dtype == "bfloat16":
        as_torch = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32))
        return as_torch.to(torch.bfloat16).view(torch.int16).numpy().astype("<i2").tobytes()
    return np.ascontiguousarray(values, dtype=np.dtype(dtype).newbyteorder("<")).tobytes()


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def wire_entry(values: Any, dtype: str = "float32", *, name: str = "output",
               kind: str = "output", parts: tuple[str, ...] = ("stats", "sketch", "sample",
                                                                 "values")) -> dict:
    values = np.asarray(values)
    shape = list(values.shape)
    raw = _wire_bytes(values, dtype)
    held = np.asarray(values, dtype=np.float32 if dtype == "bfloat16" else dtype)
    if dtype == "bfloat16":  # what the tensor really holds after rounding to bfloat16
        held = (np.frombuffer(raw, "<u2").astype(np.uint32) << np.uint32(16)).view(np.float32)
        held = held.reshape(shape)
    digest = hashlib.sha256(f"{dtype};{','.join(map(str, shape))};".encode() + raw).hexdigest()
    entry: dict[str, Any] = {"name": name, "kind": kind, "hash": digest, "dtype": dtype,
                             "shape": shape}
    flat = held.astype(np.float64).ravel()
    finite = flat[np.isfinite(flat)]
    if "stats" in parts:
        entry["stats"] = {
            "count": int(flat.size), "nan": int(np.isnan(flat).sum()),
            "inf": int(np.isinf(flat).sum()), "zero": int((flat == 0).sum()),
            "l2": float(np.linalg.norm(finite)) if finite.size else None,
        }
    if "sketch" in parts:
        entry["sketch"] = {"k": K, "dtype": "float64", "data": _b64(count_sketch(held).tobytes())}
    if "sample" in parts and flat.size:
        positions = sample_positions(flat.size)
        sample_raw = _wire_bytes(held.ravel()[positions], dtype)
        entry["sample"] = {"m": M, "dtype": dtype, "data": _b64(sample_raw)}
    if "values" in parts:
        entry["values"] = {"dtype": dtype, "data": _b64(raw)}
    return entry


@pytest.fixture
def make_fingerprint() -> Callable[..., Fingerprint]:
    def make(values: Any, dtype: str = "float32", **kwargs: Any) -> Fingerprint:
        return fingerprint_from_wire(wire_entry(values, dtype, **kwargs))

    return make


@pytest.fixture
def make_wire() -> Callable[..., dict]:
    return wire_entry


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20261121)
