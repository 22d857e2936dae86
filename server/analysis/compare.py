"""One verdict for two fingerprints of the same tensor (DESIGN §3.3).

``b`` is the reference, as ``expected`` is in ``torch.testing.assert_close``: relative
errors divide by ``|b|`` and the tolerance grows with ``|b|``. Every metric is computed in
float64 and is ``None`` where it has no meaning, never NaN. Two metrics can be infinite:
``max_rel`` (a difference where the reference is 0) and ``sqnr_db`` (no noise at all).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._arrays import FLOAT_DTYPES
from ._json import json_safe
from .fingerprint import Fingerprint
from .tolerance import Tolerance, tolerance_for
from .ulp import ulp_distance

VERDICTS = ("identical", "equivalent", "divergent", "nonfinite")
BASES = ("hash", "values", "sample", "sketch", "stats")
METRICS = (
    "max_abs", "max_rel", "max_ulp", "mismatch_fraction", "rmse", "cosine", "sqnr_db",
    "rel_l2", "rel_l2_est", "rel_l2_err",
)
# The sketch must show an error this many uncertainties above what the tolerance allows
# before it overrules a sample that looked fine.
SKETCH_SIGMAS = 3.0


@dataclass(frozen=True)
class Comparison:
    verdict: str
    basis: str
    metrics: dict[str, float | None] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: infinite metrics become None."""
        return {"verdict": self.verdict, "basis": self.basis, "metrics": json_safe(self.metrics)}


def _number(x: float | np.floating | None) -> float | None:
    if x is None:
        return None
    x = float(x)
    return None if math.isnan(x) else x


def _empty_metrics() -> dict[str, float | None]:
    return dict.fromkeys(METRICS)


@dataclass(frozen=True)
class _Elementwise:
    nonfinite_mismatch: bool
    within: bool
    metrics: dict[str, float | None]


def no_evidence() -> Comparison:
    """The bits differ and there is nothing to measure by how much (a missing fingerprint)."""
    return Comparison("divergent", "stats", _empty_metrics())


def _elementwise(a: np.ndarray, b: np.ndarray, dtype_a: str, dtype_b: str,
                 tolerance: Tolerance) -> _Elementwise:
    """Element-wise comparison of two equally long arrays (values, or two samples)."""
    a_raw, b_raw = np.ravel(a), np.ravel(b)
    a64, b64 = a_raw.astype(np.float64), b_raw.astype(np.float64)
    n = a64.size
    finite = np.isfinite(a64) & np.isfinite(b64)
    # NaN against NaN and an infinity against the same infinity count as matching.
    matching_nonfinite = (np.isnan(a64) & np.isnan(b64)) | (np.isinf(a64) & (a64 == b64))
    unmatched_nonfinite = ~finite & ~matching_nonfinite

    af, bf = a64[finite], b64[finite]
    diff = np.abs(af - bf)
    if a_raw.dtype.kind in "iub" and b_raw.dtype.kind in "iub":
        # Exact for integers beyond 2**53, which float64 would round together.
        close = a_raw == b_raw
    else:
        close = diff <= tolerance.atol + tolerance.rtol * np.abs(bf)
    metrics = _empty_metrics()
    metrics["mismatch_fraction"] = (
        float(np.count_nonzero(~close) + np.count_nonzero(unmatched_nonfinite)) / n if n else None
    )
    if diff.size:
        metrics["max_abs"] = float(diff.max())
        with np.errstate(divide="ignore", invalid="ignore"):
            rel = np.where(diff == 0, 0.0, diff / np.abs(bf))
        metrics["max_rel"] = float(rel.max())
        noise = float(np.sum(diff * diff))
        signal = float(np.sum(bf * bf))
        metrics["rmse"] = math.sqrt(noise / diff.size)
        norm_a, norm_b = math.sqrt(float(np.sum(af * af))), math.sqrt(signal)
        if norm_a > 0 and norm_b > 0:
            metrics["cosine"] = _number(float(np.dot(af, bf)) / (norm_a * norm_b))
        if noise == 0:
            metrics["sqnr_db"] = math.inf
            metrics["rel_l2"] = 0.0
        elif signal > 0:
            metrics["sqnr_db"] = _number(10.0 * math.log10(signal / noise))
            metrics["rel_l2"] = _number(math.sqrt(noise / signal))
    if dtype_a == dtype_b and dtype_a in FLOAT_DTYPES:
        comparable = ~(np.isnan(a64) | np.isnan(b64))
        if comparable.any():
            metrics["max_ulp"] = float(ulp_distance(a_raw, b_raw, dtype_a)[comparable].max())
    return _Elementwise(
        nonfinite_mismatch=bool(unmatched_nonfinite.any()),
        within=bool(close.all()),
        metrics=metrics,
    )


def _sketch_estimate(a: Fingerprint, b: Fingerprint) -> tuple[float, float] | None:
    """``||S(a) - S(b)|| / ||S(b)||`` and its uncertainty ``sqrt(2/k)`` × the estimate."""
    if a.sketch is None or b.sketch is None or a.sketch.shape != b.sketch.shape:
        return None
    sa, sb = a.sketch.astype(np.float64), b.sketch.astype(np.float64)
    if not (np.isfinite(sa).all() and np.isfinite(sb).all()):
        return None
    norm_b = float(np.linalg.norm(sb))
    if norm_b == 0:
        return None
    estimate = float(np.linalg.norm(sa - sb)) / norm_b
    return estimate, math.sqrt(2.0 / sa.size) * estimate


def _stat(fp: Fingerprint, name: str) -> float | None:
    value = (fp.stats or {}).get(name)
    return None if value is None else float(value)


def _nonfinite_counts_differ(a: Fingerprint, b: Fingerprint) -> bool:
    for name in ("nan", "inf"):
        count_a, count_b = _stat(a, name), _stat(b, name)
        if count_a is not None and count_b is not None and count_a != count_b:
            return True
    return False


def _sketch_exceeds_tolerance(a: Fingerprint, b: Fingerprint, tolerance: Tolerance,
                              estimate: tuple[float, float]) -> bool:
    """The whole-tensor error is, with high confidence, beyond what the tolerance allows.

    Element-wise closeness bounds the relative L2 error by ``rtol + atol*sqrt(n)/||b||``.
    """
    norm_b = _stat(b, "l2")
    if not norm_b:
        return False
    allowed = tolerance.rtol + tolerance.atol * math.sqrt(b.count) / norm_b
    value, uncertainty = estimate
    return value - SKETCH_SIGMAS * uncertainty > allowed


def _identical(a: Fingerprint) -> Comparison:
    metrics = _empty_metrics()
    for name in ("max_abs", "max_rel", "mismatch_fraction", "rmse", "rel_l2"):
        metrics[name] = 0.0
    if a.dtype in FLOAT_DTYPES:
        metrics["max_ulp"] = 0.0
    if a.sketch is not None:
        metrics["rel_l2_est"] = metrics["rel_l2_err"] = 0.0
    return Comparison("identical", "hash", metrics)


def compare(a: Fingerprint, b: Fingerprint, *, tolerance: Tolerance | None = None) -> Comparison:
    """Compare fingerprint ``a`` against the reference ``b``.

    The best evidence both sides have decides: the hash, then the whole ``values``, then
    the ``sample`` (with the sketch able to overrule it), then the sketch alone, then the
    stats (non-finite counts only).
    """
    if a.hash == b.hash:
        return _identical(a)
    tolerance = tolerance or tolerance_for(a.dtype, b.dtype)
    if a.shape != b.shape:
        return no_evidence()

    if a.values is not None and b.values is not None:
        result = _elementwise(a.values, b.values, a.dtype, b.dtype, tolerance)
        verdict = ("nonfinite" if result.nonfinite_mismatch
                   else "equivalent" if result.within else "divergent")
        return Comparison(verdict, "values", result.metrics)

    metrics = _empty_metrics()
    estimate = _sketch_estimate(a, b)
    if estimate is not None:
        metrics["rel_l2_est"], metrics["rel_l2_err"] = estimate
    nonfinite = _nonfinite_counts_differ(a, b)

    if a.sample is not None and b.sample is not None and a.sample.shape == b.sample.shape:
        result = _elementwise(a.sample, b.sample, a.dtype, b.dtype, tolerance)
        for name in ("max_abs", "max_rel", "max_ulp"):
            metrics[name] = result.metrics[name]
        if nonfinite or result.nonfinite_mismatch:
            return Comparison("nonfinite", "sample", metrics)
        if not result.within:
            return Comparison("divergent", "sample", metrics)
        if estimate is not None and _sketch_exceeds_tolerance(a, b, tolerance, estimate):
            return Comparison("divergent", "sketch", metrics)
        return Comparison("equivalent", "sample", metrics)

    if estimate is not None:
        if nonfinite:
            return Comparison("nonfinite", "sketch", metrics)
        exceeds = _sketch_exceeds_tolerance(a, b, tolerance, estimate)
        return Comparison("divergent" if exceeds else "equivalent", "sketch", metrics)

    # Only the stats (or nothing): the bits differ and nothing shows by how much.
    return Comparison("nonfinite" if nonfinite else "divergent", "stats", metrics)
