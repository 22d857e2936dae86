"""Fingerprint of one tensor (design §2.4).

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
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
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


def _numpy_elements(tensor: torch.Tensor) -> tuple[torch.Tensor, np.ndarray]:
    """(detached CPU tensor, numpy view of its elements in its own strides, raw bits for
    dtypes numpy lacks). Nothing is copied for a CPU tensor; torch is not asked to copy
    either, because its parallel copies stall when the node's cores are busy."""
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.resolve_conj().resolve_neg()
    view = t.view(_RAW_VIEWS[t.dtype]) if t.dtype in _RAW_VIEWS else t
    return t, view.numpy()


def _flat_le(arr: np.ndarray) -> np.ndarray:
    """A flat, C-contiguous, little-endian array of `arr`'s elements in logical order
    (the bytes of torch's `contiguous()`); a view when `arr` already is one."""
    flat = np.ascontiguousarray(arr.reshape(-1))
    return flat.astype(flat.dtype.newbyteorder("<"), copy=False)


def _le_array(tensor: torch.Tensor) -> np.ndarray:
    """The tensor's elements as a flat little-endian numpy array (raw bits if needed)."""
    return _flat_le(_numpy_elements(tensor)[1])


def _hash_raw(dtype: torch.dtype, shape: torch.Size, raw: np.ndarray) -> str:
    h = hashlib.sha256()
    dims = ",".join(str(int(d)) for d in shape)
    h.update(f"{dtype_name(dtype)};{dims};".encode())
    h.update(raw.view(np.uint8).data)  # the array's own buffer (raw is C-contiguous)
    return h.hexdigest()


def tensor_hash(tensor: torch.Tensor) -> str:
    """sha256 over dtype name, shape and the contiguous little-endian bytes."""
    return _hash_raw(tensor.dtype, tensor.shape, _le_array(tensor))


# sha256 releases the GIL, so large tensors are hashed on worker threads while the
# calling thread prepares the next tensor or computes stats and sketch.
_THREAD_MIN_BYTES = 1 << 18
_pool: tuple[int, ThreadPoolExecutor] | None = None
_pool_lock = threading.Lock()


def _hasher() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None or _pool[0] != os.getpid():  # a forked child makes its own
            _pool = (os.getpid(), ThreadPoolExecutor(2, thread_name_prefix="numparity-hash"))
        return _pool[1]


def tensor_hashes(tensors: Sequence[torch.Tensor]) -> list[str]:
    """`tensor_hash` of each tensor, in order; the large ones hashed in parallel."""
    hashes: list[str | Future[str]] = []
    for tensor in tensors:
        raw = _le_array(tensor)
        if raw.nbytes >= _THREAD_MIN_BYTES:
            hashes.append(_hasher().submit(_hash_raw, tensor.dtype, tensor.shape, raw))
        else:
            hashes.append(_hash_raw(tensor.dtype, tensor.shape, raw))
    return [h if isinstance(h, str) else h.result() for h in hashes]


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether `a` and `b` have the same `tensor_hash` (dtype, shape and bytes), decided
    where they are: on a GPU without copying either to the host, on the CPU by numpy at
    memory speed (torch's parallel reductions stall when the node's cores are busy).
    How a later repeat is checked against the first."""
    if a.dtype != b.dtype or a.shape != b.shape or a.device != b.device:
        return False
    if a.numel() == 0:
        return True
    if a.device.type == "cpu":
        return bool(np.array_equal(_words(_le_array(a)), _words(_le_array(b))))
    # The bytes as integers: torch.equal on floats would call -0.0 and 0.0 equal and a
    # NaN unequal to itself.
    return torch.equal(_device_bytes(a), _device_bytes(b))


def bit_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of `tensor`'s elements (for `same_bits` later): on the CPU
    copied by numpy, for the reason `same_bits` gives."""
    t = tensor.detach()
    if t.device.type != "cpu":
        return t.clone()
    t, elements = _numpy_elements(t)
    # numpy allocates: torch.empty under deterministic algorithms (`strict`) would first
    # fill the memory with NaN (torch.utils.deterministic.fill_uninitialized_memory).
    copy = torch.from_numpy(np.array(elements, copy=True, order="C"))
    return copy.view(t.dtype) if t.dtype in _RAW_VIEWS else copy


def _words(raw: np.ndarray) -> np.ndarray:
    """The bytes of a flat array as the widest unsigned integers that tile them."""
    data = raw.view(np.uint8)
    for width in (np.uint64, np.uint32, np.uint16):
        if data.size % np.dtype(width).itemsize == 0:
            return data.view(width)
    return data


def _device_bytes(t: torch.Tensor) -> torch.Tensor:
    flat = t.detach().resolve_conj().resolve_neg().contiguous().reshape(-1)
    return flat.view(torch.uint8) if flat.dtype != torch.bool else flat


def combined_hash(named_tensors: list[tuple[str, torch.Tensor]]) -> str:
    """sha256 of the canonical bytes of several named tensors (input_hash, param_hash)."""
    h = hashlib.sha256()
    digests = tensor_hashes([tensor for _, tensor in named_tensors])
    for (name, _), digest in zip(named_tensors, digests, strict=True):
        h.update(f"{name}={digest}\n".encode())
    return h.hexdigest()


def encode_array(arr: np.ndarray, dtype: str) -> dict[str, str]:
    le = np.ascontiguousarray(arr.astype(arr.dtype.newbyteorder("<"), copy=False))
    return {"dtype": dtype, "data": base64.b64encode(le.data).decode("ascii")}


# The sketch plan of element i depends on i alone, so one plan per k, grown on demand
# (only the new indices are computed), serves every size as a prefix view. A plan is
# compact: the bucket in the smallest unsigned integer that holds k - 1 (one byte for
# k = 256), the sign as an int8, so plans up to _PLAN_KEEP elements (128 MiB) stay
# cached and a production-size suite (16-64 million elements a tensor) computes each
# index once per process; a larger tensor gets a plan built for it alone.
_PLAN_KEEP = 1 << 26
_plans: dict[int, tuple[np.ndarray, np.ndarray]] = {}
_plans_lock = threading.Lock()


def _plan_segment(start: int, stop: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """h(i) and s(i) for start <= i < stop, computed in cache-sized blocks (the values
    are integer functions of i alone, so blocking changes nothing but the speed)."""
    buckets = np.empty(stop - start, dtype=np.min_scalar_type(k - 1))
    signs = np.empty(stop - start, dtype=np.int8)
    for a in range(start, stop, _BLOCK):
        b = min(a + _BLOCK, stop)
        x = splitmix64(_SKETCH_KEY, np.arange(a, b, dtype=np.uint64))
        high = x >> np.uint64(32)
        if k & (k - 1) == 0:  # a power of two: the remainder is the low bits
            high &= np.uint64(k - 1)
        else:
            high %= np.uint64(k)
        buckets[a - start : b - start] = high
        signs[a - start : b - start] = 1 - 2 * (x & np.uint64(1)).astype(np.int8)
    return buckets, signs


def sketch_plan(numel: int, k: int = SKETCH_K) -> tuple[np.ndarray, np.ndarray]:
    """Bucket h(i) and sign s(i) (+1 or -1) of every element index i < numel (read-only
    views)."""
    with _plans_lock:
        buckets, signs = _plans.get(k, (np.empty(0, np.min_scalar_type(k - 1)),
                                        np.empty(0, np.int8)))
        if numel > buckets.size:
            # Rounded up, so a run of slightly larger tensors does not regrow each time.
            size = numel if numel > _PLAN_KEEP else min(_PLAN_KEEP, -(-numel // _BLOCK) * _BLOCK)
            more_buckets, more_signs = _plan_segment(buckets.size, size, k)
            buckets = np.concatenate([buckets, more_buckets])
            signs = np.concatenate([signs, more_signs])
            buckets.setflags(write=False)
            signs.setflags(write=False)
            if size <= _PLAN_KEEP:
                _plans[k] = (buckets, signs)
    return buckets[:numel], signs[:numel]


def count_sketch(values: np.ndarray, k: int = SKETCH_K) -> np.ndarray:
    """CountSketch of a flat float64 array: S[b] = sum of s(i) * x[i] over h(i) == b."""
    flat = np.asarray(values, dtype=np.float64).reshape(-1)
    buckets, signs = sketch_plan(flat.size, k)
    return np.bincount(buckets, weights=signs * flat, minlength=k)


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


# Dtypes whose float64 values numpy computes exactly as torch's `to(torch.float64)`
# (widening, or integers rounded to nearest like any C cast); others go through torch.
_NUMPY_FLOAT64 = {
    torch.float16,
    torch.float32,
    torch.float64,
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
}


# The float64 copy of each tensor goes into one reused buffer per thread: writing into
# pages already mapped is about twice as fast as into a fresh array. Tensors above
# _SCRATCH_KEEP elements get a fresh array, so the agent keeps at most 32 MiB of it.
_SCRATCH_KEEP = 1 << 22
_scratch_local = threading.local()


def _scratch(n: int) -> np.ndarray:
    if n > _SCRATCH_KEEP:
        return np.empty(n, dtype=np.float64)
    buffer: np.ndarray | None = getattr(_scratch_local, "buffer", None)
    if buffer is None or buffer.size < n:
        buffer = np.empty(n, dtype=np.float64)
        _scratch_local.buffer = buffer
    return buffer[:n]


def _float64(t: torch.Tensor, raw: np.ndarray) -> np.ndarray:
    """The flat float64 values of `t` (whose flat little-endian elements are `raw`): the
    tensor's own memory for float64, else a scratch array the caller may overwrite."""
    if t.dtype == torch.float64:
        return raw
    if t.dtype in _NUMPY_FLOAT64:
        out = _scratch(raw.size)
        with np.errstate(invalid="ignore"):  # a float16 NaN converts to NaN, silently
            np.copyto(out, raw, casting="unsafe")
        return out
    if t.dtype == torch.bfloat16:  # the upper half of a float32: exact
        bits = raw.view(np.uint16).astype(np.uint32)
        np.left_shift(bits, 16, out=bits)
        out = _scratch(raw.size)
        np.copyto(out, bits.view(np.float32))
        return out
    return t.reshape(-1).to(torch.float64).numpy()


# Float64 sums are numpy's pairwise sums of the whole array. numpy splits an array of
# n > 128 elements at n2 = n // 2 rounded down to a multiple of 8 and adds the sums of
# the halves, so summing the same halves block by block -- each small enough to stay in
# the core's cache while every statistic is taken from it -- and adding them along the
# same tree gives the same bits with far less memory traffic. `_blocked_sums_exact`
# checks that this numpy splits that way; if not, the whole array is one block.
_BLOCK = 1 << 15


def _pairwise(start: int, n: int, block: int, leaf: Callable[[int, int], float]) -> float:
    if n <= block:
        return leaf(start, start + n)
    half = n // 2
    half -= half % 8
    return _pairwise(start, half, block, leaf) + _pairwise(start + half, n - half, block, leaf)


@functools.lru_cache(maxsize=1)
def _block_size() -> int:
    n = 5 * _BLOCK + 37
    u = splitmix64(_SKETCH_KEY, np.arange(n, dtype=np.uint64))
    x = (u >> np.uint64(11)).astype(np.float64) * 2.0**-53 - 0.5
    x *= 2.0 ** ((u & np.uint64(63)).astype(np.float64) - 20)  # magnitudes 2**-20..2**43
    blocked = _pairwise(0, n, _BLOCK, lambda a, b: float(np.add.reduce(x[a:b])))
    return _BLOCK if blocked == float(np.add.reduce(x)) else 1 << 62


def _stats(dtype: torch.dtype, x: np.ndarray) -> tuple[dict[str, Any], np.ndarray | None]:
    """(stats of the flat float64 array x, its finite mask or None when all are finite).

    Bit for bit what the former `finite.mean()`, `finite.std()` and
    `np.sqrt(np.sum(finite * finite))` gave: numpy's pairwise sums of the same values
    (block by block along numpy's own tree, see `_pairwise`), the same divisions, and
    numpy's std recipe (mean; the sum of squared deviations over n; sqrt).
    """
    n = int(x.size)
    mask: np.ndarray | None = None
    lo: Any = None
    hi: Any = None
    if n:
        # min and max propagate NaN and show an Inf: both finite means every value is,
        # and the pass of isfinite is saved (the common case).
        with np.errstate(invalid="ignore"):
            lo, hi = x.min(), x.max()
    if not n or (np.isfinite(lo) and np.isfinite(hi)):
        finite, n_finite, nan, inf, pos_inf = x, n, 0, 0, 0
    else:
        lo = hi = None
        finite_mask = np.isfinite(x)
        n_finite = int(np.count_nonzero(finite_mask))
        mask = finite_mask
        finite = x[mask]
        nan = int(np.count_nonzero(np.isnan(x)))
        inf = n - n_finite - nan
        pos_inf = int(np.count_nonzero(x == np.inf)) if inf else 0
    # +Inf and -Inf apart: a +Inf traded for a -Inf outside the sample changes no other
    # statistic.
    stats: dict[str, Any] = {"count": n, "nan": nan, "inf": inf, "pos_inf": pos_inf,
                             "neg_inf": inf - pos_inf}
    if not n_finite:
        stats.update(zero=0, subnormal=0, fp16_overflow=0, fp16_underflow=0)
        stats.update(min=None, max=None, mean=None, std=None, abs_max=None, l2=None)
        return stats, mask
    # min and max of the whole array (which of +-0.0 numpy returns is its own affair).
    if lo is None:
        lo, hi = finite.min(), finite.max()
    abs_max = max(abs(lo), abs(hi))  # abs(), not -lo: the largest |x| of zeros is +0.0
    tiny = float(torch.finfo(dtype).tiny) if dtype.is_floating_point else None
    block = _block_size()
    scratch = np.empty(min(n_finite, block))
    # zero, below 2**-14, below tiny, above 65504 (over finite values: an inf is
    # counted as inf, not as an fp16 overflow).
    counts = [0, 0, 0, 0]
    count_over = bool(abs_max > FP16_MAX)
    squares: list[float] = []

    def first_pass(a: int, b: int) -> float:
        chunk, s = finite[a:b], scratch[: b - a]
        np.abs(chunk, out=s)
        zero = int(np.count_nonzero(chunk == 0))
        below = int(np.count_nonzero(s < FP16_TINY))
        counts[0] += zero
        counts[1] += below - zero
        if tiny is None:
            pass  # integers have no subnormals
        elif tiny == FP16_TINY:
            counts[2] += below - zero
        elif tiny > FP16_TINY or below > zero:  # a subnormal below 2**-14 is also below it
            counts[2] += int(np.count_nonzero(s < tiny)) - zero
        if count_over:
            counts[3] += int(np.count_nonzero(s > FP16_MAX))
        total = float(np.add.reduce(chunk))
        np.multiply(chunk, chunk, out=s)
        squares.append(float(np.add.reduce(s)))
        return total

    with np.errstate(over="ignore", invalid="ignore"):
        total = _pairwise(0, n_finite, block, first_pass)
        leaf_squares = iter(squares)  # the blocks come in the same order each pass
        sum_squares = _pairwise(0, n_finite, block, lambda a, b: next(leaf_squares))
        mean = np.float64(total) / n_finite

        def deviations(a: int, b: int) -> float:
            s = scratch[: b - a]
            np.subtract(finite[a:b], mean, out=s)
            np.multiply(s, s, out=s)
            return float(np.add.reduce(s))

        std = np.sqrt(np.float64(_pairwise(0, n_finite, block, deviations)) / n_finite)
        l2 = np.sqrt(np.float64(sum_squares))
    stats.update(
        zero=counts[0],
        subnormal=counts[2],
        fp16_overflow=counts[3],
        fp16_underflow=counts[1],
        min=float(lo),
        max=float(hi),
        mean=float(mean),
        std=float(std),
        abs_max=float(abs_max),
        l2=float(l2),
    )
    return stats, mask


_STATS_ORDER = (
    "count nan inf pos_inf neg_inf zero subnormal fp16_overflow fp16_underflow min max mean "
    "std abs_max l2"
).split()


def _ordered(stats: dict[str, Any]) -> dict[str, Any]:
    return {key: stats[key] for key in _STATS_ORDER}


def tensor_stats(tensor: torch.Tensor) -> dict[str, Any]:
    t, arr = _numpy_elements(tensor)
    return _ordered(_stats(t.dtype, _float64(t, _flat_le(arr)))[0])


# Fingerprints of one repeat are computed side by side: numpy and sha256 release the GIL
# for the element passes, and the node's cores are idle between two timed runs.
_FINGERPRINT_THREADS = max(1, min(4, os.cpu_count() or 1))
_fingerprint_pool: tuple[int, ThreadPoolExecutor] | None = None


def _fingerprinter() -> ThreadPoolExecutor:
    global _fingerprint_pool
    with _pool_lock:
        if _fingerprint_pool is None or _fingerprint_pool[0] != os.getpid():
            _fingerprint_pool = (os.getpid(), ThreadPoolExecutor(
                _FINGERPRINT_THREADS, thread_name_prefix="numparity-fingerprint"))
        return _fingerprint_pool[1]


def fingerprints(tensors: Sequence[torch.Tensor],
                 keep_values: Callable[[str, np.ndarray], None] | None = None
                 ) -> list[dict[str, Any]]:
    """`fingerprint` of each tensor, in order, computed on a few threads (each tensor's
    fingerprint is its own: the same bytes whichever thread computes it).
    `keep_values` is called from one thread at a time."""
    if len(tensors) < 2 or _FINGERPRINT_THREADS < 2:
        return [fingerprint(t, keep_values) for t in tensors]
    # Copied to the host first, in order, on this thread: a GPU's copies are not
    # interleaved from several threads, and the workers only touch host memory.
    hosted = [_numpy_elements(t) for t in tensors]
    lock = threading.Lock()

    def keep(digest: str, raw: np.ndarray) -> None:
        assert keep_values is not None
        with lock:
            keep_values(digest, raw)

    def one(item: tuple[torch.Tensor, np.ndarray]) -> dict[str, Any]:
        return _fingerprint_elements(item[0], item[1], keep if keep_values else None)

    return list(_fingerprinter().map(one, hosted))


def fingerprint(tensor: torch.Tensor,
                keep_values: Callable[[str, np.ndarray], None] | None = None) -> dict[str, Any]:
    """The full §2.4 fingerprint of one tensor (without name, kind and order).

    One flat little-endian view of the elements (copied only when the tensor is not
    contiguous) feeds the hash, the sample and the values; one float64 conversion
    feeds the stats and the sketch. A tensor too large for `values` is handed to
    `keep_values(hash, elements)` when given (kept until the server asks, `_values`).
    """
    t, arr = _numpy_elements(tensor)
    return _fingerprint_elements(t, arr, keep_values)


def _fingerprint_elements(t: torch.Tensor, arr: np.ndarray,
                          keep_values: Callable[[str, np.ndarray], None] | None
                          ) -> dict[str, Any]:
    name = dtype_name(t.dtype)
    raw = _flat_le(arr)
    numel = int(raw.size)
    digest: str | Future[str]
    if raw.nbytes >= _THREAD_MIN_BYTES:  # hashed while stats and sketch are computed
        digest = _hasher().submit(_hash_raw, t.dtype, t.shape, raw)
    else:
        digest = _hash_raw(t.dtype, t.shape, raw)
    x64 = _float64(t, raw)
    stats, mask = _stats(t.dtype, x64)
    buckets, signs = sketch_plan(numel, SKETCH_K)
    # x64 is the tensor's own memory for float64 (left alone), else scratch to reuse.
    weights = np.multiply(signs, x64, out=_scratch(numel) if x64 is raw else x64)
    if mask is not None:
        weights[~mask] = 0.0  # non-finite values enter the sketch as 0
    sketch = np.bincount(buckets, weights=weights, minlength=SKETCH_K)
    positions = sample_positions(numel, SAMPLE_M)
    entry: dict[str, Any] = {
        "hash": digest if isinstance(digest, str) else digest.result(),
        "dtype": name,
        "shape": [int(d) for d in t.shape],
        "stats": _ordered(stats),
        "sketch": {"k": SKETCH_K, **encode_array(sketch, "float64")},
        "sample": {"m": int(positions.size), **encode_array(raw[positions], name)},
    }
    if numel <= VALUES_MAX:
        entry["values"] = encode_array(raw, name)
    elif keep_values is not None:
        keep_values(entry["hash"], raw)
    return entry
