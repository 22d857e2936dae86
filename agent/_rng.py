"""Portable counter-based random numbers (design §2.1).

`torch.manual_seed` streams differ between devices and releases, numpy's generators
may change between numpy versions, and transcendental functions differ in the last
ulp between libms. So inputs and weights come from SplitMix64 evaluated on explicit
counters with numpy uint64 arithmetic (wrapping, identical everywhere), and integers
become floats through exact or correctly rounded IEEE operations only: a 24-bit
integer times 2**-24, then one multiply and one add. Bell shapes are sums of twelve
uniforms (Irwin-Hall), which are exact in float64.

A stream is keyed by (seed, name): every tensor draws from its own stream, so adding
or resizing one tensor never changes the data of another.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

GAMMA = 0x9E3779B97F4A7C15
_MUL1 = 0xBF58476D1CE4E5B9
_MUL2 = 0x94D049BB133111EB

_U64 = np.uint64


def mix64(z: np.ndarray) -> np.ndarray:
    """The SplitMix64 finalizer, element-wise over uint64 (wrapping arithmetic)."""
    z = np.asarray(z, dtype=_U64)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> _U64(30))) * _U64(_MUL1)
        z = (z ^ (z >> _U64(27))) * _U64(_MUL2)
    return z ^ (z >> _U64(31))


def splitmix64(key: int, counters: np.ndarray) -> np.ndarray:
    """Outputs number `counters` (0-based) of the SplitMix64 sequence seeded with `key`.

    Sequential SplitMix64 adds GAMMA to its state and then mixes, so output i is
    mix64(key + (i + 1) * GAMMA): any element is computed without its predecessors.
    """
    c = np.asarray(counters, dtype=_U64)
    with np.errstate(over="ignore"):
        state = _U64(key & 0xFFFFFFFFFFFFFFFF) + (c + _U64(1)) * _U64(GAMMA)
    return mix64(state)


def stream_key(seed: int, name: str) -> int:
    """The 64-bit key of stream `name` under `seed` (sha256 is the same everywhere)."""
    digest = hashlib.sha256(f"numparity/{int(seed)}/{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def uniform01(key: int, n: int, *, offset: int = 0) -> np.ndarray:
    """n float64 values k * 2**-24 in [0, 1) from counters offset .. offset+n-1 (exact)."""
    out = np.empty(n, dtype=np.float64)
    for start in range(0, n, _BLOCK):
        stop = min(start + _BLOCK, n)
        out[start:stop] = _top24(key, offset + start, offset + stop)
    out *= 2.0**-24
    return out


# Large tensors are drawn block by block, each step in place on a block that stays in
# the core's cache: the same integer operations as `splitmix64`, so the same bits, at a
# fraction of the memory traffic (a 4096x4096 tensor in under a second, not three).
_BLOCK = 1 << 16


def _top24(key: int, start: int, stop: int) -> np.ndarray:
    """The top 24 bits of SplitMix64 outputs number start .. stop-1 of `key` (uint64)."""
    z = np.arange(start + 1, stop + 1, dtype=_U64)
    z *= _U64(GAMMA)  # array arithmetic wraps modulo 2**64 without a warning
    z += _U64(key & 0xFFFFFFFFFFFFFFFF)
    z ^= z >> _U64(30)
    z *= _U64(_MUL1)
    z ^= z >> _U64(27)
    z *= _U64(_MUL2)
    z ^= z >> _U64(31)
    z >>= _U64(40)
    return z


def uniform(
    seed: int,
    name: str,
    shape: Sequence[int],
    low: float = 0.0,
    high: float = 1.0,
    dtype: np.dtype | type = np.float32,
) -> np.ndarray:
    """Uniform values in [low, high) of stream (seed, name), rounded once to `dtype`."""
    key, n = stream_key(seed, name), _numel(shape)
    values = np.empty(n, dtype=dtype)
    for start in range(0, n, _BLOCK):
        stop = min(start + _BLOCK, n)
        u = uniform01(key, stop - start, offset=start)
        values[start:stop] = low + (high - low) * u  # two correctly rounded operations
    return values.reshape(tuple(shape))


def bell(
    seed: int,
    name: str,
    shape: Sequence[int],
    mean: float = 0.0,
    std: float = 1.0,
    dtype: np.dtype | type = np.float32,
) -> np.ndarray:
    """Bell-shaped values: (sum of 12 uniforms - 6) has mean 0 and variance 1.

    The sum of twelve multiples of 2**-24 below 12 fits in 28 bits, so it is exact in
    float64 whatever the summation order.
    """
    key, n = stream_key(seed, name), _numel(shape)
    values = np.empty(n, dtype=dtype)
    rows = _BLOCK // 12
    for start in range(0, n, rows):
        stop = min(start + rows, n)
        u = uniform01(key, 12 * (stop - start), offset=12 * start).reshape(-1, 12)
        values[start:stop] = mean + std * (u.sum(axis=1) - 6.0)
    return values.reshape(tuple(shape))
