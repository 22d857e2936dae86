"""A tensor's statistics recomputed from its values (design §2.4, §3.1).

Whenever a fingerprint carries its whole values, the server computes what the agent
declared and refuses a contradiction: the statistics are what `/compare` shows when the
values are gone or not yet sent ("first_nonfinite: fc1 nan 7 inf 3"), and the first
upload of a hash is what every later node of the same bytes is shown with.

Counts and extremes must be exact. Sums (mean, std, l2) are compared within a relative
1e-9: the agent's pairwise float64 sums give numpy's bits, but an agent of another
numpy version may split the sum elsewhere.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ._arrays import canonical_dtype, decode_array, itemsize

FP16_MAX = 65504.0
FP16_TINY = 2.0**-14
# The smallest normal number of each floating dtype (torch.finfo(dtype).tiny).
_TINY = {"float16": FP16_TINY, "bfloat16": 2.0**-126, "float32": 2.0**-126,
         "float64": 2.0**-1022}
EXACT = ("count", "nan", "inf", "pos_inf", "neg_inf", "zero", "subnormal", "fp16_overflow",
         "fp16_underflow", "min", "max", "abs_max")
SUMS = ("mean", "std", "l2")
SUM_RTOL = 1e-9


# Elements a chunk of ``ValuesStats`` decodes at once: its float64 copies (a few of
# them at a time) take a few MiB whatever the tensor's size.
CHUNK_ELEMENTS = 1 << 16


def stats_from_values(dtype: str, raw: bytes) -> dict[str, Any]:
    """The agent's statistics of a tensor (agent/_fingerprint.py ``_stats``) from its raw
    little-endian values."""
    stats = ValuesStats(dtype)
    stats.add(raw)
    return stats.result()


class ValuesStats:
    """``stats_from_values`` of values that arrive in pieces (of any byte length), in
    chunks of ``CHUNK_ELEMENTS``: the memory it takes is bounded, not the tensor's size
    times the float64 copies. Counts and extremes are exact; the sums of the chunks are
    added (and the deviations' by Chan's pairwise rule), within ``SUM_RTOL`` of the sums
    over the whole."""

    def __init__(self, dtype: str) -> None:
        self.dtype = dtype
        self.itemsize = itemsize(canonical_dtype(dtype))
        self._carry = b""
        self.count = self.nan = self.pos_inf = self.neg_inf = 0
        self.finite = self.zero = self.subnormal = self.overflow = self.underflow = 0
        self.lo = self.hi = math.nan
        self.mean = 0.0
        self.m2 = 0.0  # the finite values' squared deviations from ``mean``
        self.sumsq = 0.0

    def add(self, data: bytes) -> None:
        view = memoryview(self._carry + bytes(data)) if self._carry else memoryview(data)
        whole = len(view) - len(view) % self.itemsize
        step = CHUNK_ELEMENTS * self.itemsize
        for start in range(0, whole, step):
            self._chunk(bytes(view[start:min(start + step, whole)]))
        self._carry = bytes(view[whole:])

    def _chunk(self, raw: bytes) -> None:
        x = decode_array(self.dtype, raw).astype(np.float64).ravel()
        self.count += int(x.size)
        nan = int(np.count_nonzero(np.isnan(x)))
        pos_inf = int(np.count_nonzero(x == np.inf))
        self.nan += nan
        self.pos_inf += pos_inf
        finite = x[np.isfinite(x)]
        self.neg_inf += int(x.size) - int(finite.size) - nan - pos_inf
        del x
        if not finite.size:
            return
        magnitude = np.abs(finite)
        zero = int(np.count_nonzero(finite == 0))
        tiny = _TINY.get(self.dtype)
        self.zero += zero
        self.subnormal += 0 if tiny is None else int(np.count_nonzero(magnitude < tiny)) - zero
        self.overflow += int(np.count_nonzero(magnitude > FP16_MAX))
        self.underflow += int(np.count_nonzero(magnitude < FP16_TINY)) - zero
        del magnitude
        lo, hi = float(finite.min()), float(finite.max())
        self.lo = lo if math.isnan(self.lo) else min(self.lo, lo)
        self.hi = hi if math.isnan(self.hi) else max(self.hi, hi)
        n = int(finite.size)
        with np.errstate(over="ignore", invalid="ignore"):
            mean = np.float64(np.add.reduce(finite)) / n
            m2 = np.float64(np.add.reduce((finite - mean) ** 2))
            sumsq = np.float64(np.add.reduce(finite * finite))
            if not self.finite:
                self.mean, self.m2 = float(mean), float(m2)
            else:
                total = self.finite + n
                delta = float(mean) - self.mean
                self.mean += delta * n / total
                self.m2 += float(m2) + delta * delta * self.finite * n / total
            self.sumsq += float(sumsq)
        self.finite += n

    def result(self) -> dict[str, Any]:
        if self._carry:
            raise ValueError(f"{len(self._carry)} bytes past the last whole {self.dtype} "
                             "element")
        inf = self.pos_inf + self.neg_inf
        stats: dict[str, Any] = {"count": self.count, "nan": self.nan, "inf": inf,
                                 "pos_inf": self.pos_inf, "neg_inf": self.neg_inf}
        if not self.finite:
            stats.update(zero=0, subnormal=0, fp16_overflow=0, fp16_underflow=0, min=None,
                         max=None, mean=None, std=None, abs_max=None, l2=None)
            return stats
        stats.update(
            zero=self.zero, subnormal=self.subnormal, fp16_overflow=self.overflow,
            fp16_underflow=self.underflow, min=self.lo, max=self.hi,
            abs_max=max(abs(self.lo), abs(self.hi)), mean=self.mean,
            std=math.sqrt(self.m2 / self.finite), l2=math.sqrt(self.sumsq),
        )
        return stats


def contradictions(declared: dict[str, Any], computed: dict[str, Any]) -> list[str]:
    """Each declared statistic the values contradict, as ``nan 7 (the values have 0)``.
    A statistic not declared (None for the signed infinities of older agents) is not
    checked."""
    wrong = []
    for field in (*EXACT, *SUMS):
        said, truth = declared.get(field), computed[field]
        if said is None and field in ("pos_inf", "neg_inf"):
            continue
        if _agrees(field, said, truth):
            continue
        wrong.append(f"{field} {said} (the values have {truth})")
    return wrong


def _agrees(field: str, said: Any, truth: Any) -> bool:
    if said is None or truth is None:
        return said is None and truth is None
    if field in SUMS:
        if not (math.isfinite(said) and math.isfinite(truth)):
            return said == truth or (math.isnan(said) and math.isnan(truth))
        return abs(said - truth) <= SUM_RTOL * max(abs(said), abs(truth)) + 1e-300
    return float(said) == float(truth)
