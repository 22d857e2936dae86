"""Verdicts and metrics against torch.testing.assert_close and float64 recomputation."""

import json
import math

import numpy as np
import pytest
import torch

from numparity_server.analysis import Tolerance, compare, default_tolerance

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
          "float64": torch.float64}


def _assert_close_passes(a: np.ndarray, b: np.ndarray, dtype: str) -> bool:
    torch_dtype = DTYPES[dtype]
    try:
        torch.testing.assert_close(torch.from_numpy(a).to(torch_dtype),
                                   torch.from_numpy(b).to(torch_dtype), equal_nan=True)
    except AssertionError:
        return False
    return True


def _near_boundary_pair(rng, dtype: str, n: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """b, and a = b moved by 0.3–0.9 of the allowed error, one element maybe by 1.2–3."""
    tol = default_tolerance(dtype)
    b = rng.standard_normal(n) * rng.choice([1e-6, 1e-3, 1.0, 1e3])
    b = torch.from_numpy(b).to(DTYPES[dtype]).double().numpy()
    allowed = tol.atol + tol.rtol * np.abs(b)
    factor = rng.uniform(0.3, 0.9, n)
    if rng.random() < 0.5:
        factor[rng.integers(n)] = rng.uniform(1.2, 3.0)
    a = b + rng.choice([-1.0, 1.0], n) * factor * allowed
    a = torch.from_numpy(a).to(DTYPES[dtype]).double().numpy()  # what the tensor holds
    return a, b


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_verdict_agrees_with_assert_close(dtype, rng, make_fingerprint):
    seen = set()
    for _ in range(150):
        a, b = _near_boundary_pair(rng, dtype)
        comparison = compare(make_fingerprint(a, dtype), make_fingerprint(b, dtype))
        if comparison.verdict == "identical":
            continue  # rounding to the dtype undid the perturbation
        expected = "equivalent" if _assert_close_passes(a, b, dtype) else "divergent"
        assert comparison.verdict == expected
        assert comparison.basis == "values"
        seen.add(expected)
    assert seen == {"equivalent", "divergent"}


def test_float64_verdict_agrees_exactly_at_the_boundary(rng, make_fingerprint):
    # In float64 both sides do the same arithmetic, so even exact-boundary cases agree.
    for _ in range(200):
        b = rng.standard_normal(16)
        a = b + rng.choice([-1, 1], 16) * (1e-7 + 1e-7 * np.abs(b)) * rng.uniform(0.999, 1.001)
        verdict = compare(make_fingerprint(a, "float64"), make_fingerprint(b, "float64")).verdict
        assert verdict == ("equivalent" if _assert_close_passes(a, b, "float64") else "divergent")


def test_metrics_match_float64_recomputation(rng, make_fingerprint):
    b = rng.standard_normal((32, 8)).astype(np.float32)
    a = (b + rng.standard_normal(b.shape) * 1e-3).astype(np.float32)
    metrics = compare(make_fingerprint(a), make_fingerprint(b)).metrics
    ta, tb = torch.from_numpy(a).double().ravel(), torch.from_numpy(b).double().ravel()
    err = ta - tb
    assert metrics["max_abs"] == pytest.approx(err.abs().max().item(), rel=1e-12)
    assert metrics["max_rel"] == pytest.approx((err.abs() / tb.abs()).max().item(), rel=1e-12)
    assert metrics["rmse"] == pytest.approx(torch.sqrt(torch.mean(err**2)).item(), rel=1e-12)
    cosine = torch.nn.functional.cosine_similarity(ta, tb, dim=0).item()
    assert metrics["cosine"] == pytest.approx(cosine, rel=1e-12)
    sqnr = 10 * torch.log10(torch.sum(tb**2) / torch.sum(err**2)).item()
    assert metrics["sqnr_db"] == pytest.approx(sqnr, rel=1e-12)
    assert metrics["rel_l2"] == pytest.approx((err.norm() / tb.norm()).item(), rel=1e-12)
    tol = default_tolerance("float32")
    close = torch.isclose(torch.from_numpy(a), torch.from_numpy(b), rtol=tol.rtol, atol=tol.atol)
    assert metrics["mismatch_fraction"] == pytest.approx(1 - close.double().mean().item())


def test_bfloat16_ulp_metric_counts_bfloat16_steps(make_fingerprint):
    b = torch.tensor([1.0, 2.0, -4.0], dtype=torch.bfloat16)
    a = b.clone()
    for _ in range(5):  # five steps towards +inf on the last element
        a[2] = torch.nextafter(a[2:3], torch.tensor([np.inf], dtype=torch.bfloat16))[0]
    comparison = compare(make_fingerprint(a.float().numpy(), "bfloat16"),
                         make_fingerprint(b.float().numpy(), "bfloat16"))
    assert comparison.metrics["max_ulp"] == 5.0


def test_identical_by_hash(make_fingerprint, rng):
    values = rng.standard_normal(10).astype(np.float32)
    comparison = compare(make_fingerprint(values), make_fingerprint(values.copy()))
    assert (comparison.verdict, comparison.basis) == ("identical", "hash")
    assert comparison.metrics["max_abs"] == 0.0


def test_signed_zero_differs_in_bits_but_is_equivalent(make_fingerprint):
    comparison = compare(make_fingerprint(np.float32([0.0, 1.0])),
                         make_fingerprint(np.float32([-0.0, 1.0])))
    assert comparison.verdict == "equivalent"
    assert comparison.metrics["max_ulp"] == 0.0
    assert comparison.metrics["sqnr_db"] == math.inf


@pytest.mark.parametrize(("a", "b", "verdict"), [
    ([1.0, np.nan, 2.0], [1.0, np.nan, 2.0 + 1e-3], "divergent"),  # NaN matches NaN
    ([1.0, np.nan, 2.0], [1.0, 3.0, 2.0], "nonfinite"),
    ([np.inf, 1.0], [np.inf, 1.0 + 1e-6], "equivalent"),
    ([np.inf, 1.0], [-np.inf, 1.0], "nonfinite"),
    ([np.nan, 1.0], [1.0, np.nan], "nonfinite"),  # same count, different positions
])
def test_nonfinite_positions_decide(a, b, verdict, make_fingerprint):
    comparison = compare(make_fingerprint(np.float32(a)), make_fingerprint(np.float32(b)))
    assert comparison.verdict == verdict
    assert not any(isinstance(v, float) and math.isnan(v) for v in comparison.metrics.values())
    json.dumps(comparison.to_dict(), allow_nan=False)


def test_all_nan_has_null_metrics(make_fingerprint):
    nan = np.float32([np.nan, np.nan])
    comparison = compare(make_fingerprint(nan), make_fingerprint(np.float32([np.nan, 1.0])))
    assert comparison.verdict == "nonfinite"
    assert comparison.metrics["max_abs"] is None and comparison.metrics["cosine"] is None


def test_integers_are_exact(make_fingerprint):
    a, b = np.int64([2**60, 3]), np.int64([2**60 + 1, 3])  # equal in float64
    assert compare(make_fingerprint(a, "int64"), make_fingerprint(b, "int64")).verdict == (
        "divergent")


def test_tolerance_override(make_fingerprint):
    a, b = np.float32([1.0]), np.float32([1.01])
    assert compare(make_fingerprint(a), make_fingerprint(b)).verdict == "divergent"
    loose = Tolerance(rtol=0.05, atol=0.0)
    assert compare(make_fingerprint(a), make_fingerprint(b), tolerance=loose).verdict == (
        "equivalent")


def test_sample_basis_without_values(rng, make_fingerprint):
    parts = ("stats", "sketch", "sample")
    b = rng.standard_normal(10_000).astype(np.float32)
    a = b.copy()
    a[::2] += 1e-3
    comparison = compare(make_fingerprint(a, parts=parts), make_fingerprint(b, parts=parts))
    assert (comparison.verdict, comparison.basis) == ("divergent", "sample")
    exact = np.abs(a.astype(np.float64) - b)
    # Nothing element-wise was measured over the whole tensor: no maxima claimed, the
    # sample's are named as such in the evidence.
    assert all(comparison.metrics[name] is None
               for name in ("max_abs", "max_rel", "max_ulp", "rmse", "rel_l2", "sqnr_db"))
    assert comparison.evidence.startswith("from a sample of 64 of 10000 elements: max abs ")
    assert "(lower bounds); from the sketch: estimated relative L2 " in comparison.evidence
    assert comparison.metrics["rel_l2_est"] == pytest.approx(
        np.linalg.norm(exact) / np.linalg.norm(b), rel=0.3)
    # An error unrelated to b: the standard error is about sqrt(1/k) of the estimate.
    assert comparison.metrics["rel_l2_err"] == pytest.approx(
        comparison.metrics["rel_l2_est"] * math.sqrt(1 / 256), rel=0.05)


def test_sketch_overrules_a_sample_that_missed(rng, make_fingerprint):
    parts = ("stats", "sketch", "sample")
    b = rng.standard_normal(100_000).astype(np.float32)
    a = b.copy()
    a[7::997] += 50.0  # a hundred large errors, almost surely none in the 64 samples
    comparison = compare(make_fingerprint(a, parts=parts), make_fingerprint(b, parts=parts))
    assert comparison.verdict == "divergent"
    assert comparison.basis in {"sketch", "sample"}


def test_stats_counts_decide_nonfinite_without_values(rng, make_fingerprint):
    parts = ("stats", "sketch", "sample")
    b = rng.standard_normal(100_000).astype(np.float32)
    a = b.copy()
    a[12_345] = np.nan
    comparison = compare(make_fingerprint(a, parts=parts), make_fingerprint(b, parts=parts))
    assert comparison.verdict == "nonfinite"


def test_equivalent_from_sample_and_sketch(rng, make_fingerprint):
    parts = ("stats", "sketch", "sample")
    b = rng.standard_normal(50_000).astype(np.float32)
    a = np.nextafter(b, np.float32(np.inf))
    comparison = compare(make_fingerprint(a, parts=parts), make_fingerprint(b, parts=parts))
    assert (comparison.verdict, comparison.basis) == ("equivalent", "sample")
    assert comparison.metrics["max_ulp"] is None  # measured on 64 elements only
    assert "max ULP 1 there (lower bounds)" in comparison.evidence


def test_stats_only(rng, make_fingerprint):
    a = make_fingerprint(np.float32([1.0, 2.0]), parts=("stats",))
    b = make_fingerprint(np.float32([1.0, 3.0]), parts=("stats",))
    assert (compare(a, b).verdict, compare(a, b).basis) == ("divergent", "stats")
