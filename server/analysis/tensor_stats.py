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

from ._arrays import decode_array

FP16_MAX = 65504.0
FP16_TINY = 2.0**-14
# The smallest normal number of each floating dtype (torch.finfo(dtype).tiny).
_TINY = {"float16": FP16_TINY, "bfloat16": 2.0**-126, "float32": 2.0**-126,
         "float64": 2.0**-1022}
EXACT = ("count", "nan", "inf", "pos_inf", "neg_inf", "zero", "subnormal", "fp16_overflow",
         "fp16_underflow", "min", "max", "abs_max")
SUMS = ("mean", "std", "l2")
SUM_RTOL = 1e-9


def stats_from_values(dtype: str, raw: bytes) -> dict[str, Any]:
    """The agent's statistics of a tensor (agent/_fingerprint.py ``_stats``) from its raw
    little-endian values."""
    x = decode_array(dtype, raw).astype(np.float64).ravel()
    n = int(x.size)
    finite_mask = np.isfinite(x)
    finite = x[finite_mask]
    nan = int(np.count_nonzero(np.isnan(x)))
    inf = n - int(finite.size) - nan
    pos_inf = int(np.count_nonzero(x == np.inf))
    stats: dict[str, Any] = {"count": n, "nan": nan, "inf": inf, "pos_inf": pos_inf,
                             "neg_inf": inf - pos_inf}
    if not finite.size:
        stats.update(zero=0, subnormal=0, fp16_overflow=0, fp16_underflow=0, min=None,
                     max=None, mean=None, std=None, abs_max=None, l2=None)
        return stats
    magnitude = np.abs(finite)
    zero = int(np.count_nonzero(finite == 0))
    tiny = _TINY.get(dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        mean = np.float64(np.add.reduce(finite)) / finite.size
        std = np.sqrt(np.float64(np.add.reduce((finite - mean) ** 2)) / finite.size)
        l2 = np.sqrt(np.float64(np.add.reduce(finite * finite)))
    lo, hi = float(finite.min()), float(finite.max())
    stats.update(
        zero=zero,
        subnormal=0 if tiny is None else int(np.count_nonzero(magnitude < tiny)) - zero,
        fp16_overflow=int(np.count_nonzero(magnitude > FP16_MAX)),
        fp16_underflow=int(np.count_nonzero(magnitude < FP16_TINY)) - zero,
        min=lo, max=hi, abs_max=max(abs(lo), abs(hi)),
        mean=float(mean), std=float(std), l2=float(l2),
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
