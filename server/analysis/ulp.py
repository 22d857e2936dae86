"""ULP distance with the semantics of ``numpy.testing.nulp_diff``.

nulp_diff maps every float's bit pattern to a signed integer that grows with the value
(negative floats are mirrored, so -0.0 and +0.0 both map to 0) and subtracts. Infinity
is the pattern after the largest finite number, so it is one ULP from it. We do the same
in exact integer arithmetic (nulp_diff wraps around in the dtype's own integer width
and returns the count in the float dtype, which rounds large counts). bfloat16 counts
in bfloat16 steps: its pattern is the upper 16 bits of the float32 that holds it.
"""

from __future__ import annotations

import numpy as np

from ._arrays import bfloat16_bits, canonical_dtype

_UNSIGNED = {"float16": (np.float16, np.uint16), "float32": (np.float32, np.uint32),
             "float64": (np.float64, np.uint64)}
_SIGN_BITS = {"float16": 15, "bfloat16": 15, "float32": 31, "float64": 63}


def _sign_and_magnitude(values: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    if dtype == "bfloat16":
        bits = bfloat16_bits(values).astype(np.uint64)
    else:
        float_type, uint_type = _UNSIGNED[dtype]
        bits = np.ascontiguousarray(values, dtype=float_type).view(uint_type).astype(np.uint64)
    sign_bit = np.uint64(1) << np.uint64(_SIGN_BITS[dtype])
    return (bits & sign_bit) != 0, bits & (sign_bit - np.uint64(1))


def ulp_distance(a: np.ndarray, b: np.ndarray, dtype: str) -> np.ndarray:
    """Element-wise ULP distance as uint64 (NaN positions give meaningless counts: mask them).

    ``a`` and ``b`` hold values of ``dtype`` (float32 arrays for bfloat16).
    """
    name = canonical_dtype(dtype)
    if name not in _SIGN_BITS:
        raise ValueError(f"ULP distance needs a float dtype, not {dtype!r}")
    neg_a, mag_a = _sign_and_magnitude(np.asarray(a), name)
    neg_b, mag_b = _sign_and_magnitude(np.asarray(b), name)
    # Same sign: the magnitudes' difference; opposite signs: the sum (through zero).
    # Neither overflows uint64: magnitudes are below 2**63.
    same = neg_a == neg_b
    larger, smaller = np.maximum(mag_a, mag_b), np.minimum(mag_a, mag_b)
    return np.where(same, larger - smaller, mag_a + mag_b)
