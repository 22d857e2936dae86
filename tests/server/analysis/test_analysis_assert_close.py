"""The verdict is torch.testing.assert_close's, checked against torch itself.

Thousands of seeded pairs at the tolerance boundary for the four float dtypes: every
element one representable step inside torch's own boundary (found with torch.isclose),
with now and then one element a step past it, near zero, at large magnitudes, with ±0,
subnormals, infinities and NaNs, under the default tolerances and a lab policy's. Each
pair goes through the server's fingerprint decoding and ``compare``; its verdict must be
what ``assert_close(actual=a, expected=b, equal_nan=True)`` says.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch
from helpers.torch_oracle import DTYPES, default_tolerance, edge, expected_verdict, steps

from numparity_server.analysis import Tolerance, compare

PAIRS_PER_CASE = 250
N = 12


def _holder(t: torch.Tensor) -> np.ndarray:
    """The numpy values the test fingerprinter takes for a tensor of this dtype."""
    return t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy()


def _pairs(dtype: torch.dtype, rtol: float, atol: float, seed: int):
    rng = np.random.default_rng(seed)
    for index in range(PAIRS_PER_CASE):
        # Magnitudes from far below atol to far above 1 (log-uniform), either sign.
        scale = np.exp(rng.uniform(-30, 8, N))
        b = torch.from_numpy(rng.standard_normal(N) * scale).to(dtype)
        inside = edge(b, rtol, atol)
        a = steps(b, inside)
        kind = index % 5
        if kind == 1:  # one element a step past the boundary
            where = int(rng.integers(N))
            a[where] = steps(b[where:where + 1], inside[where:where + 1] + 1)[0]
        elif kind == 2:  # signed zeros and subnormals
            b[: N // 3] = 0.0
            a[: N // 3] = -0.0
            tiny = torch.finfo(dtype).tiny
            b[N // 3] = tiny / 4
            a[N // 3] = tiny / 2 if rng.random() < 0.5 else tiny / 4
        elif kind == 3:  # infinities: matched, or traded for the other sign
            b[0] = float("inf")
            a[0] = float("inf") if rng.random() < 0.5 else float("-inf")
        elif kind == 4:  # NaN on both sides, or on one
            b[1] = float("nan")
            a[1] = float("nan") if rng.random() < 0.5 else 1.0
        yield a, b


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("policy", ["default", "lab"])
def test_every_verdict_is_assert_closes(dtype_name, policy, make_fingerprint):
    dtype = DTYPES[dtype_name]
    rtol, atol = default_tolerance(dtype) if policy == "default" else (3e-3, 2e-4)
    tolerance = Tolerance(rtol=rtol, atol=atol)
    seen: dict[str, int] = {}
    wrong = []
    for a, b in _pairs(dtype, rtol, atol, seed=zlib.crc32(f"{dtype_name}/{policy}".encode())):
        want = expected_verdict(a, b, rtol, atol)
        got = compare(make_fingerprint(_holder(a), dtype_name, name="a"),
                      make_fingerprint(_holder(b), dtype_name, name="b"),
                      tolerance=tolerance)
        seen[want] = seen.get(want, 0) + 1
        if got.verdict != want:
            wrong.append((a.tolist(), b.tolist(), got.verdict, want))
    assert wrong == []
    # The generator reaches every verdict, so the test can fail on each.
    assert set(seen) >= {"equivalent", "divergent", "nonfinite"}, seen


def test_float16_atol_is_rounded_as_torch_rounds_it(make_fingerprint):
    """float16's 1e-5 is 1.00136e-5 once rounded: a difference between the two is close
    for torch (and was called divergent by an exact float64 test)."""
    b = torch.zeros(4, dtype=torch.float16)
    a = torch.full((4,), 1.0e-5, dtype=torch.float16)  # rounds to 1.0013580e-05
    assert float(a[0]) > 1e-5
    assert expected_verdict(a, b) == "equivalent"
    comparison = compare(make_fingerprint(a.numpy(), "float16", name="a"),
                         make_fingerprint(b.numpy(), "float16", name="b"))
    assert comparison.verdict == "equivalent"
