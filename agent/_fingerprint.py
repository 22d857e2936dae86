"""Fingerprint of one tensor (DESIGN §2.4).

- `hash`: sha256 over the dtype name, the shape and the contiguous little-endian
  bytes, so bitwise identity means exactly that (-0.0 != +0.0, NaN payloads count).
- `stats`: computed in float64 on the CPU; non-finite values are counted and the
  float statistics are over the finite values (None when there are none).
- `sketch`: CountSketch of k buckets in float64, element i into bucket h(i) with sign
  s(i), both from the portable integer hash of i. Non-finite values enter as 0 (they
  are counted in stats), so the sketch stays linear over finite tensors.
- `sample`: the exact values at m positions that are a pure function of (numel, m).
- `values`: the whole tensor in its own dtype when it has at most 4096 elements.

Arrays travel as {"dtype", "data": base64 of little-endian bytes}; bfloat16 as its
raw 16-bit patterns.
"""

from __future__ import annotations

import base64
import functools
import hashlib
from typing import Any

import numpy as np
import torch

from numparity_agent._rng import splitmix64, stream_key

SKETCH_K = 256
SAMPLE_M = 64
VALUES_MAX = 4096

FP16_MAX = 65504.0
FP16_TINY = 2.0**-14  # smallest normal float16: below it fp16 loses precision or flushes

# Keys of the portable hashes; changing them changes every sketch and sample.
_SKETCH_KEY = stream_key(0, "fingerprint/sketch")
_SAMPLE_KEY = stream_key(0, "fingerprint/sample")

# Dtypes numpy has no type for travel as their raw bit patterns.
_RAW_VIEWS: dict[torch.dtype, torch.dtype] = {torch.bfloat16: torch.int16}
for _name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"):
    if hasattr(torch, _name):
        _RAW_VIEWS[getattr(torch, _name)] = torch.uint8


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _le_array(tensor: torch.Tensor) -> np.ndarray:
    """The tensor's elements as a flat little-endian numpy array (raw bits if needed)."""
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous().reshape(-1)
    if t.dtype in _RAW_VIEWS:
        t = t.view(_RAW_VIEWS[t.dtype])
    arr = t.numpy()
    return arr.astype(arr.dtype.newbyteorder("<"), copy=False)


def tensor_hash(tensor: torch.Tensor) -> str:
    """sha256 over dtype name, shape and the contiguous little-endian bytes."""
    arr = _le_array(tensor)
    h = hashlib.sha256()
    shape = ",".join(str(int(d)) for d in tensor.shape)
    h.update(f"{dtype_name(tensor.dtype)};{shape};".encode())
    h.update(np.ascontiguousarray(arr).view(np.uint8).data)
    return h.hexdigest()


def combined_hash(named_tensors: list[tuple[str, torch.Tensor]]) -> str:
    """sha256 of the canonical bytes of several named tensors (input_hash, param_hash)."""
    h = hashlib.sha256()
    for name, tensor in named_tensors:
        h.update(f"{name}={tensor_hash(tensor)}\n".encode())
    return h.hexdigest()


def encode_array(arr: np.ndarray, dtype: str) -> dict[str, str]:
    le = np.ascontiguousarray(arr.astype(arr.dtype.newbyteorder("<"), copy=False))
    return {"dtype": dtype, "data": base64.b64encode(le.tobytes()).decode("ascii")}


@functools.lru_cache(maxsize=8)
def sketch_plan(numel: int, k: int = SKETCH_K) -> tuple[np.ndarray, np.ndarray]:
    """Bucket h(i) and sign s(i) of every element index i < numel."""
    x = splitmix64(_SKETCH_KEY, np.arange(numel, dtype=np.uint64))
    buckets = ((x >> np.uint64(32)) % np.uint64(k)).astype(np.intp)
    signs = np.where((x & np.uint64(1)) == 0, 1.0, -1.0)
    buckets.setflags(write=False)
    signs.setflags(write=False)
    return buckets, signs


def count_sketch(values: np.ndarray, k: int = SKETCH_K) -> np.ndarray:
    """CountSketch of a flat float64 array: S[b] = sum of s(i) * x[i] over h(i) == b."""
    flat = np.asarray(values, dtype=np.float64).reshape(-1)
    buckets, signs = sketch_plan(flat.size, k)
    return np.bincount(buckets, weights=signs * flat, minlength=k).astype(np.float64)


@functools.lru_cache(maxsize=64)
def sample_positions(numel: int, m: int = SAMPLE_M) -> np.ndarray:
    """m distinct sorted positions below numel, a pure function of (numel, m)."""
    if numel <= m:
        return np.arange(numel, dtype=np.int64)
    key = int(splitmix64(_SAMPLE_KEY, np.array([numel], dtype=np.uint64))[0])
    chosen: list[int] = []
    seen: set[int] = set()
    offset = 0
    while len(chosen) < m:
        x = splitmix64(key, np.arange(offset, offset + 2 * m, dtype=np.uint64))
        for p in (x % np.uint64(numel)).tolist():
            if p not in seen:
                seen.add(p)
                chosen.append(p)
                if len(chosen) == m:
                    break
        offset += 2 * m
    positions = np.array(sorted(chosen), dtype=np.int64)
    positions.setflags(write=False)
    return positions


def _float_or_none(x: Any) -> float | None:
    return None if x is None else float(x)


def tensor_stats(tensor: torch.Tensor) -> dict[str, Any]:
    t = tensor.detach()
    x = t.to("cpu", torch.float64).reshape(-1).numpy()
    nan = np.isnan(x)
    inf = np.isinf(x)
    finite_mask = ~(nan | inf)
    finite = x if finite_mask.all() else x[finite_mask]
    absf = np.abs(finite)
    if t.dtype.is_floating_point:
        tiny = float(torch.finfo(t.dtype).tiny)
        subnormal = int(np.count_nonzero((absf > 0) & (absf < tiny)))
    else:
        subnormal = 0
    stats: dict[str, Any] = {
        "count": int(x.size),
        "nan": int(np.count_nonzero(nan)),
        "inf": int(np.count_nonzero(inf)),
        "zero": int(np.count_nonzero(x == 0)),
        "subnormal": subnormal,
        # Over finite values: an inf is counted as inf, not as an fp16 overflow.
        "fp16_overflow": int(np.count_nonzero(absf > FP16_MAX)),
        "fp16_underflow": int(np.count_nonzero((absf > 0) & (absf < FP16_TINY))),
    }
    if finite.size:
        stats.update(
            min=float(finite.min()),
            max=float(finite.max()),
            mean=float(finite.mean()),
            std=float(finite.std()),  # population std (ddof=0)
            abs_max=float(absf.max()),
            l2=float(np.sqrt(np.sum(finite * finite))),
        )
    else:
        stats.update(min=None, max=None, mean=None, std=None, abs_max=None, l2=None)
    return stats


def fingerprint(tensor: torch.Tensor) -> dict[str, Any]:
    """The full §2.4 fingerprint of one tensor (without name, kind and order)."""
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    name = dtype_name(t.dtype)
    numel = t.numel()
    raw = _le_array(t)
    x64 = t.to(torch.float64).reshape(-1).numpy()
    finite = np.where(np.isfinite(x64), x64, 0.0)
    positions = sample_positions(numel, SAMPLE_M)
    entry: dict[str, Any] = {
        "hash": tensor_hash(t),
        "dtype": name,
        "shape": [int(d) for d in t.shape],
        "stats": tensor_stats(t),
        "sketch": {"k": SKETCH_K, **encode_array(count_sketch(finite), "float64")},
        "sample": {"m": int(positions.size), **encode_array(raw[positions], name)},
    }
    if numel <= VALUES_MAX:
        entry["values"] = encode_array(raw, name)
    return entry
