"""The chunked element-wise comparison against a whole-array float64 recomputation.

``compare`` goes through ``values`` a chunk at a time, in two threads for long arrays.
Most tests here shrink the chunk so that NaN, ±inf, ±0 and subnormals sit on both sides
of chunk boundaries, and check every metric against an oracle written here in plain
numpy float64 over the whole arrays, numpy's ``nulp_diff`` (bfloat16: its rank among all
bfloat16 values) for the ULPs, and ``torch.testing.assert_close`` for the verdict.
"""

import importlib
import json
import math
from fractions import Fraction

import numpy as np
import pytest
import torch

# numpy 2 no longer re-exports nulp_diff from numpy.testing; it still lives here.
from numpy.testing._private.utils import nulp_diff

from numparity_server.analysis import Fingerprint, compare, default_tolerance

# The module, not the function the package re-exports under the same name.
compare_module = importlib.import_module("numparity_server.analysis.compare")

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
          "float64": torch.float64}
SMALL_CHUNK = 1000
N = 10_500  # ten and a half small chunks
SMALLEST_SUBNORMAL = {"float16": 2.0**-24, "bfloat16": 2.0**-133, "float32": 2.0**-149,
                      "float64": 2.0**-1074}
EXACT = ("max_abs", "max_rel", "mismatch_fraction")
SUMS = ("rmse", "cosine", "sqnr_db", "rel_l2")


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of 1000 elements, shared by two threads whatever the length."""
    monkeypatch.setattr(compare_module, "_CHUNK", SMALL_CHUNK)
    monkeypatch.setattr(compare_module, "_THREADS_MIN", 0)


def _held(values: np.ndarray, dtype: str) -> np.ndarray:
    """What a tensor of ``dtype`` holds, as the server's numpy sees it (bfloat16 in float32)."""
    tensor = torch.from_numpy(np.asarray(values, dtype=np.float64)).to(DTYPES[dtype])
    return tensor.float().numpy() if dtype == "bfloat16" else tensor.numpy()


def _fingerprint(values: np.ndarray, dtype: str, name: str) -> Fingerprint:
    # Placeholder hashes: the server receives hashes, and these pairs differ.
    return Fingerprint(hash=name, dtype=dtype, shape=values.shape, values=values)


def _assert_close_passes(a: np.ndarray, b: np.ndarray, dtype: str) -> bool:
    try:
        torch.testing.assert_close(torch.from_numpy(a).to(DTYPES[dtype]),
                                   torch.from_numpy(b).to(DTYPES[dtype]), equal_nan=True)
    except AssertionError:
        return False
    return True


def _bfloat16_rank(values: np.ndarray) -> np.ndarray:
    """Position among all non-NaN bfloat16 values in order (-0 and +0 share one)."""
    every = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)
    every = every.view(torch.bfloat16)
    ordered = torch.unique(every[~torch.isnan(every)].float()).numpy()
    return np.searchsorted(ordered, values).astype(np.int64)


def _oracle(a: np.ndarray, b: np.ndarray, dtype: str) -> dict:
    """Every metric, recomputed over the whole arrays in float64."""
    tol = default_tolerance(dtype)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    finite = np.isfinite(a64) & np.isfinite(b64)
    matched = (np.isnan(a64) & np.isnan(b64)) | (np.isinf(a64) & (a64 == b64))
    unmatched = ~finite & ~matched
    x, y = a64[finite], b64[finite]
    err = np.abs(x - y)
    far = ~(err <= tol.atol + tol.rtol * np.abs(y))
    noise, signal = np.sum(err * err), np.sum(y * y)
    metrics = {
        "unmatched": bool(unmatched.any()),
        "mismatch_fraction": (np.count_nonzero(far) + np.count_nonzero(unmatched)) / a.size,
        "max_abs": err.max(),
        "max_rel": np.divide(err, np.abs(y), out=np.zeros_like(err), where=err > 0).max(),
        "rmse": math.sqrt(noise / err.size),
        "cosine": np.sum(x * y) / math.sqrt(np.sum(x * x) * signal),
        "sqnr_db": 10 * math.log10(signal / noise),
        "rel_l2": math.sqrt(noise / signal),
    }
    comparable = ~(np.isnan(a64) | np.isnan(b64))
    if dtype == "bfloat16":
        ranks = np.abs(_bfloat16_rank(a[comparable]) - _bfloat16_rank(b[comparable]))
        metrics["max_ulp"] = float(ranks.max())
    else:
        # nulp_diff counts in the dtype's own integer width and returns the count rounded
        # to the float dtype: the data keeps every distance within that width, and the
        # comparison rounds our exact count the same way.
        metrics["max_ulp"] = nulp_diff(a[comparable], b[comparable]).max()
    return metrics


def _pair(rng: np.random.Generator, dtype: str, case: str, n: int = N,
          chunk: int = SMALL_CHUNK) -> tuple[np.ndarray, np.ndarray]:
    """(a, b) of ``dtype``: b mixed magnitudes, a within half the tolerance of b, and
    special values on both sides of chunk boundaries; ``case`` adds a divergent element
    or unmatched non-finite values."""
    tol = default_tolerance(dtype)
    b = rng.standard_normal(n) * rng.choice([1e-3, 1.0, 30.0], n)
    b[2 * chunk:3 * chunk] = 0.0  # a whole chunk of zeros: 0/0 relative errors only
    b = _held(b, dtype).astype(np.float64)
    allowed = tol.atol + tol.rtol * np.abs(b)
    a = b + rng.choice([-1.0, 1.0], n) * rng.uniform(0.05, 0.4, n) * allowed
    a[2 * chunk:3 * chunk] = 0.0
    tiny = SMALLEST_SUBNORMAL[dtype]
    at = [chunk - 1, chunk, chunk + 1]  # the first boundary, and more below
    a[at], b[at] = [np.nan, np.inf, -np.inf], [np.nan, np.inf, -np.inf]
    signed_zeros = [2 * chunk, 3 * chunk - 1, 4 * chunk - 1]
    a[signed_zeros], b[signed_zeros] = -0.0, 0.0
    b[4 * chunk] = -0.0  # against +0.0 in a
    a[4 * chunk] = 0.0
    # Subnormals across the fifth boundary, some of them crossing zero.
    span = slice(5 * chunk - 10, 5 * chunk + 10)
    b[span] = rng.integers(-40, 40, 20) * tiny
    a[span] = b[span] + rng.integers(-3, 4, 20) * tiny
    a[5 * chunk - 1], a[5 * chunk] = -b[5 * chunk - 1], -b[5 * chunk]
    if case == "divergent":
        i = 10 * chunk - 1
        a[i] = b[i] + 4 * np.sign(rng.standard_normal()) * allowed[i]
    elif case == "nonfinite":
        a[7 * chunk], b[7 * chunk + 1] = np.nan, np.nan  # each against a number
        b[8 * chunk - 1] = abs(b[8 * chunk - 1]) + 1.0  # +inf against a positive number
        a[8 * chunk - 1] = np.inf
    return _held(a, dtype), _held(b, dtype)


def _check_against_oracle(a: np.ndarray, b: np.ndarray, dtype: str) -> str:
    comparison = compare(_fingerprint(a, dtype, "a"), _fingerprint(b, dtype, "b"))
    metrics, oracle = comparison.metrics, _oracle(a, b, dtype)
    for name in EXACT:  # maxima and counts do not depend on the summation order
        assert metrics[name] == oracle[name], name
    for name in SUMS:
        assert metrics[name] == pytest.approx(oracle[name], rel=1e-12, abs=0), name
    if dtype == "bfloat16":
        assert metrics["max_ulp"] == oracle["max_ulp"]
    else:
        assert np.dtype(dtype).type(metrics["max_ulp"]) == oracle["max_ulp"]
    passes = _assert_close_passes(a, b, dtype)
    if oracle["unmatched"]:
        assert comparison.verdict == "nonfinite" and not passes
    else:
        assert comparison.verdict == ("equivalent" if passes else "divergent")
    assert comparison.basis == "values"
    json.dumps(comparison.to_dict(), allow_nan=False)
    return comparison.verdict


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize(("case", "verdict"), [
    ("close", "equivalent"), ("divergent", "divergent"), ("nonfinite", "nonfinite"),
])
def test_chunks_match_whole_array_float64(dtype, case, verdict, rng, small_chunks):
    a, b = _pair(rng, dtype, case)
    assert _check_against_oracle(a, b, dtype) == verdict


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_real_chunk_size_and_threads(dtype, rng):
    """Without shrinking anything: long enough for several chunks and for two threads."""
    chunk = compare_module._CHUNK
    n = max(compare_module._THREADS_MIN, 8 * chunk) + 4321
    for case, verdict in (("close", "equivalent"), ("divergent", "divergent")):
        a, b = _pair(rng, dtype, case, n=n, chunk=chunk)
        assert _check_against_oracle(a, b, dtype) == verdict


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_largest_ulp_distance_in_either_direction(dtype, sign, rng, small_chunks):
    """One element 7 ULP below its reference, the others 0 to 2 ULP above (or the
    reverse, with a and b swapped), in chunks where every pair has the same sign."""
    b = torch.from_numpy(sign * rng.uniform(0.5, 4.0, 5500)).to(DTYPES[dtype])
    steps = rng.integers(0, 3, 5500)
    steps[3 * SMALL_CHUNK + 5] = -7
    a = b.clone()
    for _ in range(7):
        towards = torch.where(torch.from_numpy(steps) > 0, math.inf, -math.inf).to(b.dtype)
        moved = torch.nextafter(a, towards)
        a = torch.where(torch.from_numpy(steps) != 0, moved, a)
        steps = steps - np.sign(steps)
    a, b = _held(a.double().numpy(), dtype), _held(b.double().numpy(), dtype)
    for x, y in ((a, b), (b, a)):
        metrics = compare(_fingerprint(x, dtype, "x"), _fingerprint(y, dtype, "y")).metrics
        assert metrics["max_ulp"] == 7.0 == _oracle(x, y, dtype)["max_ulp"]


def test_opposite_zeros_only(small_chunks):
    """Every pair is 0 against -0: no error at all, in every chunk."""
    a, b = np.zeros(3500, dtype=np.float32), np.full(3500, -0.0, dtype=np.float32)
    metrics = compare(_fingerprint(a, "float32", "a"), _fingerprint(b, "float32", "b")).metrics
    assert (metrics["max_abs"], metrics["max_rel"], metrics["max_ulp"]) == (0.0, 0.0, 0.0)
    assert (metrics["rmse"], metrics["sqnr_db"], metrics["rel_l2"]) == (0.0, math.inf, 0.0)
    assert metrics["cosine"] is None  # no direction to compare


def test_same_numbers_in_one_thread_or_two(rng, small_chunks, monkeypatch):
    a, b = _pair(rng, "float32", "divergent", n=50 * SMALL_CHUNK + 17)
    fa, fb = _fingerprint(a, "float32", "a"), _fingerprint(b, "float32", "b")
    two = compare(fa, fb).metrics
    assert compare(fa, fb).metrics == two
    monkeypatch.setattr(compare_module, "_THREADS", 1)
    assert compare(fa, fb).metrics == two


def test_integers_stay_exact_across_chunks(small_chunks):
    b = np.arange(5500, dtype=np.int64) + 2**60
    a = b.copy()
    a[4000] += 1  # equal to b[4000] once both are rounded to float64
    comparison = compare(_fingerprint(a, "int64", "a"), _fingerprint(b, "int64", "b"))
    assert comparison.verdict == "divergent"
    assert comparison.metrics["mismatch_fraction"] == 1 / 5500
    assert comparison.metrics["max_ulp"] is None


def test_nan_chunk_and_all_nan_give_null_metrics(small_chunks):
    a = np.full(2500, np.nan, dtype=np.float32)
    comparison = compare(_fingerprint(a, "float32", "a"), _fingerprint(a.copy(), "float32", "b"))
    assert comparison.verdict == "equivalent"  # NaN matches NaN; nothing else to measure
    assert comparison.metrics["mismatch_fraction"] == 0.0
    assert all(comparison.metrics[name] is None for name in (*EXACT[:2], *SUMS, "max_ulp"))


def test_a_difference_whose_square_overflows_float64_is_still_measured(small_chunks):
    b = np.linspace(1.0, 2.0, 3000)
    a = b.copy()
    a[1500] = 1e300  # its difference squared overflows float64 unless scaled
    comparison = compare(_fingerprint(a, "float64", "a"), _fingerprint(b, "float64", "b"))
    assert comparison.verdict == "divergent"
    assert comparison.metrics["max_abs"] == pytest.approx(1e300)
    # The oracle: exact rational sums of squares.
    noise = sum((Fraction(x) - Fraction(y)) ** 2 for x, y in zip(a, b, strict=True))
    signal = sum(Fraction(y) ** 2 for y in b)
    assert comparison.metrics["rmse"] == pytest.approx(
        math.sqrt(noise / 3000 / 10**600) * 1e300, rel=1e-12)
    assert comparison.metrics["sqnr_db"] == pytest.approx(
        10 * (math.log10(signal / noise * 10**600) - 600), rel=1e-12)
    json.dumps(comparison.to_dict(), allow_nan=False)


def test_a_difference_that_overflows_float64_gives_infinite_metrics_not_an_error(small_chunks):
    b = np.linspace(1.0, 2.0, 3000)
    a = b.copy()
    a[1500], b[1500] = 1.5e308, -1.5e308  # a - b is beyond float64
    comparison = compare(_fingerprint(a, "float64", "a"), _fingerprint(b, "float64", "b"))
    assert comparison.verdict == "divergent"
    assert comparison.metrics["max_abs"] == math.inf
    assert comparison.metrics["rmse"] == math.inf
    assert comparison.metrics["sqnr_db"] == -math.inf
    assert comparison.to_dict()["metrics"]["sqnr_db"] is None
    json.dumps(comparison.to_dict(), allow_nan=False)


def _exact_sums(a, b):
    noise = sum((Fraction(float(x)) - Fraction(float(y))) ** 2 for x, y in zip(a, b, strict=True))
    signal = sum(Fraction(float(y)) ** 2 for y in b)
    norm_a = sum(Fraction(float(x)) ** 2 for x in a)
    dot = sum(Fraction(float(x)) * Fraction(float(y)) for x, y in zip(a, b, strict=True))
    return noise, signal, norm_a, dot


def _sqrt(q: Fraction) -> float:
    """sqrt of a positive rational of any size, to float64 precision."""
    shift = (q.numerator.bit_length() - q.denominator.bit_length()) // 2 * 2
    return math.sqrt(float(q / Fraction(2) ** shift)) * 2.0 ** (shift // 2)


def _log10(q: Fraction) -> float:
    return math.log10(q.numerator) - math.log10(q.denominator)


@pytest.mark.parametrize("magnitude", [5e-324 * 2**20, 1e-310, 1.0, 1e300])
def test_l2_rmse_sqnr_and_cosine_are_exact_at_any_magnitude(magnitude, small_chunks, rng):
    """float64 subnormals (whose squares underflow) and huge values (whose squares
    overflow) against exact rational arithmetic."""
    b = rng.standard_normal(3000) * magnitude
    a = b + rng.standard_normal(3000) * magnitude * 0.45
    comparison = compare(_fingerprint(a, "float64", "a"), _fingerprint(b, "float64", "b"))
    noise, signal, norm_a, dot = _exact_sums(a, b)
    metrics = comparison.metrics
    assert metrics["rel_l2"] == pytest.approx(_sqrt(noise / signal), rel=1e-12)
    assert metrics["rmse"] == pytest.approx(_sqrt(noise / 3000), rel=1e-12)
    assert metrics["sqnr_db"] == pytest.approx(10 * _log10(signal / noise), rel=1e-12)
    assert metrics["cosine"] == pytest.approx(
        float(dot / abs(dot)) / _sqrt(norm_a * signal / dot**2), rel=1e-12)
    assert metrics["max_abs"] == float(max(abs(Fraction(x) - Fraction(y))
                                           for x, y in zip(a, b, strict=True)))
