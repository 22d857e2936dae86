"""One verdict for two fingerprints of the same tensor (DESIGN §3.3).

``b`` is the reference, as ``expected`` is in ``torch.testing.assert_close``: relative
errors divide by ``|b|`` and the tolerance grows with ``|b|``. Every metric is computed in
float64 and is ``None`` where it has no meaning, never NaN. Two metrics can be infinite:
``max_rel`` (a difference where the reference is 0) and ``sqnr_db`` (no noise at all), as
can every error metric of float64 values whose difference overflows.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._arrays import FLOAT_DTYPES
from ._json import json_safe
from .fingerprint import Fingerprint
from .tolerance import Tolerance, tolerance_for
from .ulp import max_ulp_distance, rank_dtype

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


# Elements per chunk. The element-wise metrics go through the arrays a chunk at a time,
# so each chunk's float64 scratch stays in a core's cache instead of a dozen full-size
# float64 temporaries streaming through memory.
_CHUNK = 1 << 16
# From this many elements on, two threads share the chunks (numpy's loops release the
# GIL); below, a thread costs more than it saves.
_THREADS_MIN = 1 << 20
_THREADS = 2


def _dot(x: np.ndarray, y: np.ndarray) -> float:
    # einsum's own loop, not BLAS: OpenBLAS splits a long dot over its threads, which
    # stall when the cores are busy (and would compete with ours).
    return float(np.einsum("i,i->", x, y))


class _Scan:
    """The shared, read-only side of one element-wise comparison, and its partial sums.

    Every chunk writes its four float64 sums (noise, signal, ||a||², a·b) into its own
    row; they are added up in chunk order, so the result does not depend on which
    thread took which chunk.
    """

    def __init__(self, a: np.ndarray, b: np.ndarray, dtype_a: str, dtype_b: str,
                 tolerance: Tolerance) -> None:
        self.a, self.b, self.tolerance = a, b, tolerance
        # Exact for integers beyond 2**53, which float64 would round together.
        self.exact = a.dtype.kind in "iub" and b.dtype.kind in "iub"
        self.ulp_dtype = dtype_a if dtype_a == dtype_b and dtype_a in FLOAT_DTYPES else None
        self.chunks = -(-a.size // _CHUNK)
        self.sums = np.zeros((self.chunks, 4))

    def run(self) -> _Tally:
        chunks = iter(range(self.chunks))  # shared: each next() is atomic under the GIL
        if self.a.size < _THREADS_MIN or _THREADS < 2:
            return _Worker(self).run(chunks)
        with ThreadPoolExecutor(_THREADS - 1, thread_name_prefix="numparity-compare") as pool:
            others = [pool.submit(_Worker(self).run, chunks) for _ in range(_THREADS - 1)]
            tally = _Worker(self).run(chunks)
            for other in others:
                tally.merge(other.result())
        return tally

    def total(self, column: int) -> float:
        # Pairwise summation, IEEE to the end: an overflow gives inf and inf - inf a NaN,
        # as one np.sum over the whole array would.
        return float(np.sum(self.sums[:, column]))


class _Tally:
    """Counts and maxima over the chunks one worker took (order does not matter)."""

    def __init__(self) -> None:
        self.finite = 0  # pairs where both sides are finite
        self.mismatches = 0  # pairs not close, or with an unmatched non-finite value
        self.unmatched = 0  # pairs with an unmatched non-finite value
        self.max_abs = -math.inf
        self.max_rel = -math.inf
        self.max_ulp = -1  # -1 while every pair has a NaN

    def merge(self, other: _Tally) -> None:
        self.finite += other.finite
        self.mismatches += other.mismatches
        self.unmatched += other.unmatched
        self.max_abs = max(self.max_abs, other.max_abs)
        self.max_rel = max(self.max_rel, other.max_rel)
        self.max_ulp = max(self.max_ulp, other.max_ulp)


class _Worker:
    """Takes chunks of a ``_Scan`` until none is left, with its own scratch arrays."""

    def __init__(self, scan: _Scan) -> None:
        self.scan = scan
        self.tally = _Tally()
        size = min(_CHUNK, scan.a.size)
        self.a64, self.b64, self.work = (np.empty(size) for _ in range(3))
        self.flags = np.empty(size, dtype=bool)
        if scan.ulp_dtype is not None:
            ranks = rank_dtype(scan.ulp_dtype)
            self.ranks_a, self.ranks_b, self.sign = (np.empty(size, ranks) for _ in range(3))

    def run(self, chunks: Iterator[int]) -> _Tally:
        with np.errstate(all="ignore"):  # per thread; 0/0 and inf are handled below
            for index in chunks:
                part = slice(index * _CHUNK, (index + 1) * _CHUNK)
                self._chunk(self.scan.a[part], self.scan.b[part], self.scan.sums[index])
        return self.tally

    def _chunk(self, a: np.ndarray, b: np.ndarray, sums: np.ndarray) -> None:
        if self._finite_pairs(a, b, sums, checked=False):
            if self.scan.ulp_dtype is not None:
                self._max_ulp(a, b)
            return
        # Some value is NaN or infinite: count those pairs, measure the others.
        finite = np.isfinite(a) & np.isfinite(b)
        # NaN against NaN and an infinity against the same infinity count as matching.
        matching = (np.isnan(a) & np.isnan(b)) | (np.isinf(a) & (a == b))
        unmatched = int(np.count_nonzero(~finite & ~matching))
        self.tally.unmatched += unmatched
        self.tally.mismatches += unmatched
        if finite.any():
            self._finite_pairs(a[finite], b[finite], sums, checked=True)
        if self.scan.ulp_dtype is not None:
            self._max_ulp(a, b, ~(np.isnan(a) | np.isnan(b)))

    def _finite_pairs(self, a: np.ndarray, b: np.ndarray, sums: np.ndarray, *,
                      checked: bool) -> bool:
        """Every metric but the ULPs over pairs of finite numbers. Unless ``checked``, a NaN
        or infinity among them returns False before anything is counted."""
        scan, tally, n = self.scan, self.tally, a.size
        a64, b64, work, flags = self.a64[:n], self.b64[:n], self.work[:n], self.flags[:n]
        np.copyto(a64, a, casting="unsafe")
        np.copyto(b64, b, casting="unsafe")
        diff = np.subtract(a64, b64, out=work)
        noise = _dot(diff, diff)
        # A NaN or an infinity on either side makes the sum non-finite. So does a float64
        # difference or square that overflows: that chunk comes back checked, and its inf
        # goes through the metrics as in a whole-array computation.
        if not (checked or math.isfinite(noise)):
            return False
        tally.finite += n
        sums[:] = noise, _dot(b64, b64), _dot(a64, a64), _dot(a64, b64)
        np.abs(diff, out=diff)
        max_abs = float(diff.max())
        tally.max_abs = max(tally.max_abs, max_abs)
        abs_b = np.abs(b64, out=b64)
        if scan.exact:
            tally.mismatches += n - int(np.count_nonzero(np.equal(a, b, out=flags)))
        elif not (max_abs <= scan.tolerance.atol and scan.tolerance.rtol >= 0):
            # (Otherwise every pair is close: rounding is monotonic, so the float64
            # atol + rtol * |b| below is never under atol.)
            allowed = np.multiply(abs_b, scan.tolerance.rtol, out=a64)
            np.add(allowed, scan.tolerance.atol, out=allowed)
            close = np.less_equal(diff, allowed, out=flags)
            tally.mismatches += n - int(np.count_nonzero(close))
        # 0/0 (no difference where the reference is 0) gives a NaN that fmax skips: that
        # pair's relative error is 0, and no relative error is below 0.
        rel = float(np.fmax.reduce(np.divide(diff, abs_b, out=a64)))
        tally.max_rel = max(tally.max_rel, 0.0 if math.isnan(rel) else rel)
        return True

    def _max_ulp(self, a: np.ndarray, b: np.ndarray,
                 comparable: np.ndarray | None = None) -> None:
        dtype, n = self.scan.ulp_dtype, a.size
        assert dtype is not None
        scratch = (self.ranks_a[:n], self.ranks_b[:n], self.sign[:n])
        distance = max_ulp_distance(a, b, dtype, comparable, scratch)
        if distance is not None:
            self.tally.max_ulp = max(self.tally.max_ulp, distance)


def _elementwise(a: np.ndarray, b: np.ndarray, dtype_a: str, dtype_b: str,
                 tolerance: Tolerance) -> _Elementwise:
    """Element-wise comparison of two equally long arrays (values, or two samples)."""
    scan = _Scan(np.ravel(a), np.ravel(b), dtype_a, dtype_b, tolerance)
    tally = scan.run()
    n = scan.a.size
    metrics = _empty_metrics()
    metrics["mismatch_fraction"] = float(tally.mismatches) / n if n else None
    if tally.finite:
        metrics["max_abs"] = tally.max_abs
        metrics["max_rel"] = tally.max_rel
        noise, signal = scan.total(0), scan.total(1)
        metrics["rmse"] = math.sqrt(noise / tally.finite)
        norm_a, norm_b = math.sqrt(scan.total(2)), math.sqrt(signal)
        if norm_a > 0 and norm_b > 0:
            metrics["cosine"] = _number(scan.total(3) / (norm_a * norm_b))
        if noise == 0:
            metrics["sqnr_db"] = math.inf
            metrics["rel_l2"] = 0.0
        elif signal > 0:
            # signal / noise is 0 only when the noise overflowed float64 (-inf dB).
            ratio = signal / noise
            metrics["sqnr_db"] = _number(10.0 * math.log10(ratio) if ratio else -math.inf)
            metrics["rel_l2"] = _number(math.sqrt(noise / signal))
    if scan.ulp_dtype is not None and tally.max_ulp >= 0:
        metrics["max_ulp"] = float(tally.max_ulp)
    return _Elementwise(
        nonfinite_mismatch=tally.unmatched > 0,
        within=tally.mismatches == tally.unmatched,  # every finite pair is close
        metrics=metrics,
    )


def _sketch_estimate(a: Fingerprint, b: Fingerprint) -> tuple[float, float] | None:
    """``||S(a) - S(b)|| / ||S(b)||`` and its standard error.

    The estimate is off by about ``sqrt(1/k)`` of itself for an error unrelated to ``b``
    (``sqrt(2/k)`` is the relative error of a squared norm; both norms of the ratio carry
    half of it) and by almost nothing for an error along ``b``, a rescaling, which the
    ratio measures exactly. The sketch keeps inner products, so it shows which part of
    the error is not along ``b``: that part over ``sqrt(k)`` is the standard error
    (``estimate * sqrt((1 - rho**2) / k)``, rho the error's correlation with ``b``). The
    true value lies within one standard error of the estimate about 68 % of the time and
    within two about 95 % (for an error in fewer elements than k, more often).
    """
    if a.sketch is None or b.sketch is None or a.sketch.shape != b.sketch.shape:
        return None
    sa, sb = a.sketch.astype(np.float64), b.sketch.astype(np.float64)
    if not (np.isfinite(sa).all() and np.isfinite(sb).all()):
        return None
    norm_b = float(np.linalg.norm(sb))
    if norm_b == 0:
        return None
    error = sa - sb
    across = error - (float(error @ sb) / norm_b**2) * sb
    estimate = float(np.linalg.norm(error)) / norm_b
    return estimate, float(np.linalg.norm(across)) / norm_b / math.sqrt(sa.size)


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
