"""What torch itself says about two tensors: the oracle of the judge's tests.

``expected_verdict`` asks ``torch.testing.assert_close`` (never the server's code);
``edge`` finds, element by element with ``torch.isclose``, how far a value can move
and still be close, so tests can place differences one step inside or outside.
"""

from __future__ import annotations

import torch

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16,
          "float32": torch.float32, "float64": torch.float64}
_INT = {torch.float16: torch.int16, torch.bfloat16: torch.int16,
        torch.float32: torch.int32, torch.float64: torch.int64}


def default_tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """assert_close's default (rtol, atol) for ``dtype`` (the server's default policy)."""
    return {torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5),
            torch.float32: (1.3e-6, 1e-5), torch.float64: (1e-7, 1e-7)}[dtype]


def steps(a: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``a`` moved ``k`` representable numbers away from zero (bit patterns + k)."""
    return (a.view(_INT[a.dtype]) + k.to(_INT[a.dtype])).view(a.dtype)


def edge(a: torch.Tensor, rtol: float | None = None, atol: float | None = None
         ) -> torch.Tensor:
    """Per element the largest step count away from zero that ``torch.isclose`` still
    calls close to ``a`` (the expected value): a binary search over the steps."""
    if rtol is None or atol is None:
        rtol, atol = default_tolerance(a.dtype)
    lo = torch.zeros(a.shape, dtype=torch.int64)  # close
    # Not close: far beyond any tolerance, within the integer view's range.
    hi = torch.full(a.shape, {2: 1 << 14, 4: 1 << 28, 8: 1 << 60}[a.element_size()])
    for _ in range(62):
        mid = (lo + hi) // 2
        moved = steps(a, mid)
        close = torch.isclose(moved, a, rtol=rtol, atol=atol) & torch.isfinite(moved)
        lo = torch.where(close, mid, lo)
        hi = torch.where(close, hi, mid)
    return lo


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and torch.equal(a.view(_INT[a.dtype]), b.view(_INT[b.dtype]))


def expected_verdict(actual: torch.Tensor, expected: torch.Tensor,
                     rtol: float | None = None, atol: float | None = None) -> str:
    """identical bits, else what ``assert_close(actual, expected, equal_nan=True)`` says;
    a failure is nonfinite when some NaN or infinity has no match, else divergent."""
    if same_bits(actual, expected):
        return "identical"
    if rtol is None or atol is None:
        rtol, atol = default_tolerance(expected.dtype)
    try:
        torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, equal_nan=True)
        return "equivalent"
    except AssertionError:
        pass
    finite = torch.isfinite(actual) & torch.isfinite(expected)
    matched = ((torch.isnan(actual) & torch.isnan(expected))
               | (torch.isinf(actual) & (actual == expected)))
    return "nonfinite" if bool((~finite & ~matched).any()) else "divergent"
