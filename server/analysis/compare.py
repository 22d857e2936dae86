"""One verdict for two fingerprints of the same tensor (design §3.3).

``b`` is the reference, as ``expected`` is in ``torch.testing.assert_close``: relative
errors divide by ``|b|`` and the tolerance grows with ``|b|``. With the whole values on
both sides the verdict is assert_close's own: ``equivalent`` when
``assert_close(actual=a, expected=b, equal_nan=True)`` passes under the tolerance
(closeness computed as torch computes it, ``closeness.py``), ``nonfinite`` when it fails
because a NaN or an infinity has no match (NaN against NaN is equal: the convention; an
infinity matches only the same infinity), ``divergent`` when it fails on finite values.

Metrics are measured, never guessed. The element-wise ones (max abs / rel / ULP,
mismatch fraction, RMSE, cosine, SQNR, relative L2) come only from the whole values,
exactly (max abs and max rel are the float64 rounding of the exact maxima of float
inputs, RMSE and L2 are computed with power-of-two scaling so subnormals neither
vanish nor huge values overflow); without the values they are ``None`` and
``evidence`` says what the verdict rests on: the sample's maxima (a lower bound) and
the sketch's estimate of the relative L2 error with its uncertainty
(``rel_l2_est ± rel_l2_err``). Every metric is ``None`` where it has no meaning, never
NaN. Two can be infinite: ``max_rel`` (a difference where the reference is 0) and
``sqnr_db`` (no noise at all), as can every error metric of float64 values whose
difference overflows.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ._arrays import FLOAT_DTYPES
from ._json import json_safe
from .closeness import close_count, promoted_dtype
from .fingerprint import CHUNK as _VALUES_CHUNK
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
    evidence: str = ""  # what the verdict rests on, in words, when not the whole values
    semantics: str = "cpu"  # whose isclose arithmetic judged it: "cpu" or "cuda"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: infinite metrics become None."""
        return {"verdict": self.verdict, "basis": self.basis,
                "metrics": json_safe(self.metrics), "evidence": self.evidence,
                "semantics": self.semantics}


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
    return Comparison("divergent", "stats", _empty_metrics(),
                      "the bits differ; no fingerprint to measure by how much")


# Elements per chunk. The element-wise metrics go through the arrays a chunk at a time,
# so each chunk's float64 scratch stays in a core's cache instead of a dozen full-size
# float64 temporaries streaming through memory.
_CHUNK = _VALUES_CHUNK
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

    The two sides come as aligned chunks (``pairs``: both sides' i-th ``_CHUNK``
    elements), taken by the workers one at a time under a lock: stored values are
    decoded a chunk at a time, so a scan holds a chunk per worker, never the arrays.
    Every chunk writes its four float64 sums (noise, signal, ||a||², a·b) into its own
    row; they are added up in chunk order, so the result does not depend on which
    thread took which chunk.
    """

    def __init__(self, size: int, pairs: Iterator[tuple[np.ndarray, np.ndarray]],
                 dtype_a: str, dtype_b: str, tolerance: Tolerance,
                 semantics: str = "cpu") -> None:
        self.size, self.tolerance, self.semantics = size, tolerance, semantics
        self._pairs = enumerate(pairs)
        self._lock = threading.Lock()
        # Exact for integers beyond 2**53, which float64 would round together.
        self.exact = dtype_a not in FLOAT_DTYPES and dtype_b not in FLOAT_DTYPES
        self.ulp_dtype = dtype_a if dtype_a == dtype_b and dtype_a in FLOAT_DTYPES else None
        # The dtype isclose computes in: assert_close promotes two dtypes to one.
        self.close_dtype = promoted_dtype(dtype_a, dtype_b)
        self.chunks = -(-size // _CHUNK)
        # Per chunk, four scaled sums and their binary exponents (see _Worker._sums).
        self.sums = np.zeros((self.chunks, 4))
        self.exponents = np.zeros((self.chunks, 4), dtype=np.int64)

    def take(self) -> tuple[int, np.ndarray, np.ndarray] | None:
        """The next chunk of both sides with its index; None when none is left."""
        with self._lock:
            found = next(self._pairs, None)
        if found is None:
            return None
        index, (a, b) = found
        return index, a, b

    def run(self) -> _Tally:
        if self.size < _THREADS_MIN or _THREADS < 2:
            return _Worker(self).run()
        with ThreadPoolExecutor(_THREADS - 1, thread_name_prefix="numparity-compare") as pool:
            others = [pool.submit(_Worker(self).run) for _ in range(_THREADS - 1)]
            tally = _Worker(self).run()
            for other in others:
                tally.merge(other.result())
        return tally

    def total(self, column: int) -> tuple[float, int]:
        """The column's sum over the chunks as ``(mantissa, exponent)``: the sum is
        ``mantissa * 2**exponent``. Chunks are brought to the largest exponent (a chunk
        far below it only loses what cannot count next to the largest) and added by
        pairwise summation, so a float64 subnormal tensor's squares do not underflow
        and a huge one's do not overflow."""
        exponents = self.exponents[:, column]
        top = int(exponents.max()) if exponents.size else 0
        terms = np.ldexp(self.sums[:, column], exponents - top)
        return float(np.sum(terms)), top


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
        size = min(_CHUNK, scan.size)
        self.a64, self.b64, self.work, self.spare = (np.empty(size) for _ in range(4))
        self.flags = np.empty(size, dtype=bool)
        if scan.ulp_dtype is not None:
            ranks = rank_dtype(scan.ulp_dtype)
            self.ranks_a, self.ranks_b, self.sign = (np.empty(size, ranks) for _ in range(3))

    def run(self) -> _Tally:
        with np.errstate(all="ignore"):  # per thread; 0/0 and inf are handled below
            while (taken := self.scan.take()) is not None:
                self._chunk(taken[1], taken[2], taken[0])
        return self.tally

    def _chunk(self, a: np.ndarray, b: np.ndarray, index: int) -> None:
        if self._finite_pairs(a, b, index, checked=False):
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
            self._finite_pairs(a[finite], b[finite], index, checked=True)
        if self.scan.ulp_dtype is not None:
            self._max_ulp(a, b, ~(np.isnan(a) | np.isnan(b)))

    def _finite_pairs(self, a: np.ndarray, b: np.ndarray, index: int, *,
                      checked: bool) -> bool:
        """Every metric but the ULPs over pairs of finite numbers. Unless ``checked``, a NaN
        or infinity among them returns False before anything is counted."""
        scan, tally, n = self.scan, self.tally, a.size
        a64, b64, work, flags = self.a64[:n], self.b64[:n], self.work[:n], self.flags[:n]
        np.copyto(a64, a, casting="unsafe")
        np.copyto(b64, b, casting="unsafe")
        diff = np.subtract(a64, b64, out=work)
        # A NaN or an infinity on either side makes the sum non-finite. So does a float64
        # difference that overflows, or a square of one: that chunk comes back checked.
        if not (checked or math.isfinite(_dot(diff, diff))):
            return False
        tally.finite += n
        np.abs(diff, out=diff)
        max_abs = float(diff.max())
        tally.max_abs = max(tally.max_abs, max_abs)
        if scan.exact:
            tally.mismatches += n - int(np.count_nonzero(np.equal(a, b, out=flags)))
        elif not (max_abs < scan.tolerance.atol and scan.tolerance.rtol >= 0):
            # (Otherwise every pair is close: |a - b| < atol, rounded to any dtype, is at
            # most atol rounded to it, and isclose's allowed error is never below that.)
            tally.mismatches += n - close_count(a, b, scan.close_dtype, scan.tolerance,
                                                scan.semantics)
        abs_b = np.abs(b64, out=self.spare[:n])
        # 0/0 (no difference where the reference is 0) gives a NaN that fmax skips: that
        # pair's relative error is 0, and no relative error is below 0.
        with np.errstate(divide="ignore", invalid="ignore"):
            rel = float(np.fmax.reduce(np.divide(diff, abs_b, out=abs_b)))
        tally.max_rel = max(tally.max_rel, 0.0 if math.isnan(rel) else rel)
        self._sums(diff, max_abs, a64, b64, index)
        return True

    def _sums(self, diff: np.ndarray, max_abs: float, a64: np.ndarray, b64: np.ndarray,
              index: int) -> None:
        """The chunk's ||a-b||², ||b||², ||a||² and a·b, each over values scaled by a power
        of two (exact) that brings the chunk's largest magnitude near 1, with the scale's
        exponent beside it. Squares of float64 subnormals (or of 1e200) would underflow
        (overflow) unscaled: the relative L2 error of two subnormal tensors came out 0."""
        sums, exponents = self.scan.sums[index], self.scan.exponents[index]
        scales = []
        for values, largest in ((diff, max_abs), (a64, None), (b64, None)):
            if largest is None:
                largest = max(float(values.max()), -float(values.min()))
            # frexp(inf) has exponent 0: an overflowed difference stays inf in its sum.
            scale = math.frexp(largest)[1] if math.isfinite(largest) else 0
            if scale:
                np.ldexp(values, -scale, out=values)
            scales.append(scale)
        noise_e, a_e, b_e = scales
        sums[:] = _dot(diff, diff), _dot(b64, b64), _dot(a64, a64), _dot(a64, b64)
        exponents[:] = 2 * noise_e, 2 * b_e, 2 * a_e, a_e + b_e

    def _max_ulp(self, a: np.ndarray, b: np.ndarray,
                 comparable: np.ndarray | None = None) -> None:
        dtype, n = self.scan.ulp_dtype, a.size
        assert dtype is not None
        scratch = (self.ranks_a[:n], self.ranks_b[:n], self.sign[:n])
        distance = max_ulp_distance(a, b, dtype, comparable, scratch)
        if distance is not None:
            self.tally.max_ulp = max(self.tally.max_ulp, distance)


def _elementwise(a: np.ndarray, b: np.ndarray, dtype_a: str, dtype_b: str,
                 tolerance: Tolerance, semantics: str = "cpu") -> _Elementwise:
    """Element-wise comparison of two equally long arrays (two samples)."""
    flat_a, flat_b = np.ravel(a), np.ravel(b)
    pairs = ((flat_a[start:start + _CHUNK], flat_b[start:start + _CHUNK])
             for start in range(0, flat_a.size, _CHUNK))
    return _elementwise_chunks(flat_a.size, pairs, dtype_a, dtype_b, tolerance, semantics)


def _elementwise_values(a: Fingerprint, b: Fingerprint, tolerance: Tolerance,
                        semantics: str = "cpu") -> _Elementwise:
    """Element-wise comparison of two tensors' whole values, a chunk at a time."""
    pairs = zip(a.value_chunks(_CHUNK), b.value_chunks(_CHUNK), strict=True)
    return _elementwise_chunks(a.count, pairs, a.dtype, b.dtype, tolerance, semantics)


def _elementwise_chunks(n: int, pairs: Iterator[tuple[np.ndarray, np.ndarray]],
                        dtype_a: str, dtype_b: str, tolerance: Tolerance,
                        semantics: str = "cpu") -> _Elementwise:
    scan = _Scan(n, pairs, dtype_a, dtype_b, tolerance, semantics)
    tally = scan.run()
    metrics = _empty_metrics()
    metrics["mismatch_fraction"] = float(tally.mismatches) / n if n else None
    if tally.finite:
        metrics["max_abs"] = tally.max_abs
        metrics["max_rel"] = tally.max_rel
        (noise, noise_e), (signal, signal_e) = scan.total(0), scan.total(1)
        (norm_a2, a_e), (dot_ab, ab_e) = scan.total(2), scan.total(3)
        metrics["rmse"] = _scaled_sqrt(noise / tally.finite, noise_e)
        if norm_a2 > 0 and signal > 0:
            # The exponents of a·b and of ||a||·||b|| cancel: a_e/2 + b_e/2 == ab_e.
            metrics["cosine"] = _number(dot_ab / (math.sqrt(norm_a2) * math.sqrt(signal))
                                        * 2.0 ** (ab_e - (a_e + signal_e) // 2))
        if noise == 0:
            metrics["sqnr_db"] = math.inf
            metrics["rel_l2"] = 0.0
        elif signal > 0 and math.isfinite(noise):
            ratio = signal / noise
            log2_ratio = math.log2(ratio) + (signal_e - noise_e)
            metrics["sqnr_db"] = _number(10.0 * math.log10(2.0) * log2_ratio)
            metrics["rel_l2"] = _scaled_sqrt(noise / signal, noise_e - signal_e)
        elif signal > 0:  # the difference overflowed float64
            metrics["sqnr_db"] = -math.inf
            metrics["rel_l2"] = math.inf
    if scan.ulp_dtype is not None and tally.max_ulp >= 0:
        metrics["max_ulp"] = float(tally.max_ulp)
    return _Elementwise(
        nonfinite_mismatch=tally.unmatched > 0,
        within=tally.mismatches == tally.unmatched,  # every finite pair is close
        metrics=metrics,
    )


def _scaled_sqrt(mantissa: float, exponent: int) -> float:
    """sqrt(mantissa * 2**exponent) without forming the product (it may not fit a float64
    while its square root does); the exponent is even for every sum of squares."""
    if not math.isfinite(mantissa):
        return mantissa
    half, odd = divmod(exponent, 2)
    return math.ldexp(math.sqrt(mantissa * (2.0 if odd else 1.0)), half)


def _sketch_estimate(a: Fingerprint, b: Fingerprint) -> tuple[float, float] | None:
    """``||S(a) - S(b)|| / ||S(b)||`` and its standard error; None where the sketches
    cannot tell (missing, non-finite, a zero reference, or equal sketches: the bits
    differ, so an estimate of exactly 0 ± 0 would claim what nothing measured).

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
    error = sa - sb
    if norm_b == 0 or not error.any():
        return None
    across = error - (float(error @ sb) / norm_b**2) * sb
    estimate = float(np.linalg.norm(error)) / norm_b
    return estimate, float(np.linalg.norm(across)) / norm_b / math.sqrt(sa.size)


def _stat(fp: Fingerprint, name: str) -> float | None:
    value = (fp.stats or {}).get(name)
    return None if value is None else float(value)


def _nonfinite_counts_differ(a: Fingerprint, b: Fingerprint) -> bool:
    """The stats count different NaNs or infinities: some non-finite value has no match.
    Signed counts (from agents that send them) also catch +Inf traded for -Inf."""
    for name in ("nan", "inf", "pos_inf", "neg_inf"):
        count_a, count_b = _stat(a, name), _stat(b, name)
        if count_a is not None and count_b is not None and count_a != count_b:
            return True
    return False


def _number_text(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3g}"


def _sample_evidence(metrics: dict[str, float | None], size: int, count: int) -> str:
    return (f"from a sample of {size} of {count} elements: max abs "
            f"{_number_text(metrics['max_abs'])}, max rel {_number_text(metrics['max_rel'])}"
            f", max ULP {_number_text(metrics['max_ulp'])} there (lower bounds)")


def _sketch_evidence(estimate: tuple[float, float] | None) -> str:
    if estimate is None:
        return "no estimate from the sketch"
    return (f"from the sketch: estimated relative L2 {estimate[0]:.3g} "
            f"± {estimate[1]:.2g}")


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


def compare(a: Fingerprint, b: Fingerprint, *, tolerance: Tolerance | None = None,
            semantics: str = "cpu") -> Comparison:
    """Compare fingerprint ``a`` against the reference ``b``.

    The best evidence both sides have decides: the hash, then the whole ``values``, then
    the ``sample`` (with the sketch able to overrule it), then the sketch alone, then the
    stats (non-finite counts only). Closeness is isclose's in the arithmetic of
    ``semantics`` ("cuda" when both were computed on CUDA devices, ``closeness``).
    """
    comparison = _compare(a, b, tolerance, semantics)
    return comparison if semantics == "cpu" else replace(comparison, semantics=semantics)


def _compare(a: Fingerprint, b: Fingerprint, tolerance: Tolerance | None,
             semantics: str = "cpu") -> Comparison:
    if a.hash == b.hash:
        return _identical(a)
    tolerance = tolerance or tolerance_for(a.dtype, b.dtype)
    if a.shape != b.shape:
        return no_evidence()

    if a.has_values and b.has_values:
        result = _elementwise_values(a, b, tolerance, semantics)
        verdict = ("nonfinite" if result.nonfinite_mismatch
                   else "equivalent" if result.within else "divergent")
        return Comparison(verdict, "values", result.metrics)

    # Without the whole values no element-wise metric is measured: they stay None and
    # the evidence says what was seen.
    metrics = _empty_metrics()
    estimate = _sketch_estimate(a, b)
    if estimate is not None:
        metrics["rel_l2_est"], metrics["rel_l2_err"] = estimate
    sketched = _sketch_evidence(estimate)
    nonfinite = _nonfinite_counts_differ(a, b)
    counted = "; the stats count different NaN or Inf" if nonfinite else ""

    if a.sample is not None and b.sample is not None and a.sample.shape == b.sample.shape:
        result = _elementwise(a.sample, b.sample, a.dtype, b.dtype, tolerance, semantics)
        evidence = f"{_sample_evidence(result.metrics, a.sample.size, a.count)}; {sketched}"
        if nonfinite or result.nonfinite_mismatch:
            return Comparison("nonfinite", "sample", metrics, evidence + counted)
        if not result.within:
            return Comparison("divergent", "sample", metrics, evidence)
        if estimate is not None and _sketch_exceeds_tolerance(a, b, tolerance, estimate):
            return Comparison("divergent", "sketch", metrics,
                              f"{evidence}, beyond what the tolerance allows")
        return Comparison("equivalent", "sample", metrics, evidence)

    if estimate is not None:
        if nonfinite:
            return Comparison("nonfinite", "sketch", metrics, sketched + counted)
        exceeds = _sketch_exceeds_tolerance(a, b, tolerance, estimate)
        return Comparison("divergent" if exceeds else "equivalent", "sketch", metrics,
                          sketched)

    # Only the stats (or nothing): the bits differ and nothing shows by how much.
    return Comparison("nonfinite" if nonfinite else "divergent", "stats", metrics,
                      "the bits differ; nothing measures by how much" + counted)
