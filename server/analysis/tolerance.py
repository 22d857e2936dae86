"""Tolerance policy per dtype (design §3.3)."""

from __future__ import annotations

from dataclasses import dataclass

from ._arrays import canonical_dtype


@dataclass(frozen=True)
class Tolerance:
    """Element-wise closeness ``|a - b| <= atol + rtol * |b|`` (b is the reference)."""

    rtol: float
    atol: float


# torch.testing.assert_close defaults; integers and bool must match exactly.
DEFAULT_TOLERANCES: dict[str, Tolerance] = {
    "float16": Tolerance(rtol=1e-3, atol=1e-5),
    "bfloat16": Tolerance(rtol=1.6e-2, atol=1e-5),
    "float32": Tolerance(rtol=1.3e-6, atol=1e-5),
    "float64": Tolerance(rtol=1e-7, atol=1e-7),
}
EXACT = Tolerance(rtol=0.0, atol=0.0)


def default_tolerance(dtype: str) -> Tolerance:
    """assert_close's default for ``dtype``; exact for integer and bool dtypes."""
    return DEFAULT_TOLERANCES.get(canonical_dtype(dtype), EXACT)


def tolerance_for(dtype_a: str, dtype_b: str) -> Tolerance:
    """The looser of the two dtypes' defaults (the same dtype on both sides as a rule)."""
    a, b = default_tolerance(dtype_a), default_tolerance(dtype_b)
    return Tolerance(rtol=max(a.rtol, b.rtol), atol=max(a.atol, b.atol))
