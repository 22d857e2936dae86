"""The fp64 judge (design §3.3), as PyTorch's own accuracy checks do it.

torch._dynamo's ``same(ref, res, fp64_ref)`` accepts a lower-precision result when its
RMSE against the float64 answer is at most ``multiplier ×`` the baseline's RMSE against
it, plus ``tol / 10``; the multiplier is 3 for float16/bfloat16 and 2 otherwise. Our
baseline is the ``strict`` float32 CPU result.

dynamo's baseline runs in the result's own dtype; ours is float32 even for the autocast
variants, so the fixed term must hold a half-precision result's own rounding error. The
default ``tol`` is therefore ``10 × rtol`` of the dtype: the fixed term is one rtol,
which for float16 is dynamo's own amp tolerance (1e-2 / 10). It is absolute, as in
dynamo; ``divergence_report`` scales it by the reference's RMS.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from ._arrays import canonical_dtype
from .tolerance import Tolerance, default_tolerance

_HALF_PRECISION = frozenset({"float16", "bfloat16"})
JUDGE_TOL_PER_RTOL = 10.0


@dataclass(frozen=True)
class Judgement:
    acceptable: bool | None  # None: an RMSE is missing, nothing can be said
    rmse: float | None
    baseline_rmse: float | None
    multiplier: float
    limit: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _finite(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def judge(
    group_vs_fp64_rmse: float | None,
    baseline_vs_fp64_rmse: float | None,
    dtype: str,
    tol: float | Tolerance | None = None,
) -> Judgement:
    """Is a group's error against float64 acceptable next to the baseline's?

    ``tol`` defaults to ``10 × rtol`` of the dtype's default tolerance; a ``Tolerance``
    gives ``10 × its rtol``. A NaN or infinite group RMSE is never acceptable; without
    a baseline RMSE (or a group RMSE) the verdict is ``None``.
    """
    name = canonical_dtype(dtype)
    multiplier = 3.0 if name in _HALF_PRECISION else 2.0
    if tol is None:
        tol = default_tolerance(name)
    if isinstance(tol, Tolerance):
        tol = JUDGE_TOL_PER_RTOL * tol.rtol
    baseline = _finite(baseline_vs_fp64_rmse)
    limit = None if baseline is None else multiplier * baseline + float(tol) / 10.0
    if group_vs_fp64_rmse is None:
        acceptable = None
    elif not math.isfinite(group_vs_fp64_rmse):
        acceptable = False
    elif limit is None:
        acceptable = None
    else:
        acceptable = float(group_vs_fp64_rmse) <= limit
    return Judgement(
        acceptable=acceptable,
        rmse=_finite(group_vs_fp64_rmse),
        baseline_rmse=baseline,
        multiplier=multiplier,
        limit=limit,
    )
