"""ULP distance with the semantics of ``numpy.testing.nulp_diff``.

nulp_diff maps every float's bit pattern to a signed integer that grows with the value
(negative floats are mirrored, so -0.0 and +0.0 both map to 0) and subtracts. Infinity
is the pattern after the largest finite number, so it is one ULP from it. We do the same
in exact integer arithmetic (nulp_diff wraps around in the dtype's own integer width
and returns the count in the float dtype, which rounds large counts). bfloat16 counts
in bfloat16 steps: its pattern is the upper 16 bits of the float32 that holds it.

The ranks fit the dtype's own signed width (magnitudes are below ``2**(bits-1)``) and
the distance of two ranks its unsigned width (it is below ``2**bits``), so float32 works
in 32-bit integers throughout: half the memory traffic of 64-bit ones.
"""

from __future__ import annotations

import numpy as np

from ._arrays import canonical_dtype

# dtype -> (float type holding the values, signed integer of its width, magnitude mask).
# bfloat16 keeps the upper half of its float32 holder: its ranks (and so its distances)
# are 65536 times the bfloat16 ones, exactly.
_LAYOUTS: dict[str, tuple[type[np.floating], type[np.signedinteger], int]] = {
    "float16": (np.float16, np.int16, 0x7FFF),
    "bfloat16": (np.float32, np.int32, 0x7FFF_0000),
    "float32": (np.float32, np.int32, 0x7FFF_FFFF),
    "float64": (np.float64, np.int64, 0x7FFF_FFFF_FFFF_FFFF),
}
_BFLOAT16_SHIFT = 16


def _layout(dtype: str) -> tuple[type[np.floating], type[np.signedinteger], int]:
    name = canonical_dtype(dtype)
    if name not in _LAYOUTS:
        raise ValueError(f"ULP distance needs a float dtype, not {dtype!r}")
    return _LAYOUTS[name]


def rank_dtype(dtype: str) -> np.dtype:
    """The signed integer dtype ``ulp_ranks`` returns for values of ``dtype``."""
    return np.dtype(_layout(dtype)[1])


def ulp_shift(dtype: str) -> int:
    """Right shift from a distance of ranks to a count of ULPs (16 for bfloat16, else 0)."""
    return _BFLOAT16_SHIFT if canonical_dtype(dtype) == "bfloat16" else 0


def ulp_ranks(values: np.ndarray, dtype: str, out: np.ndarray | None = None,
              sign: np.ndarray | None = None) -> np.ndarray:
    """nulp_diff's integer of each value: the magnitude bits, negated when the sign bit is
    set, in ``rank_dtype(dtype)``. ``out`` and ``sign`` are optional scratch arrays of
    that dtype and the values' length (the chunked comparison reuses them).
    """
    float_type, int_type, magnitude = _layout(dtype)
    bits = np.ascontiguousarray(values, dtype=float_type).view(int_type)
    if out is None:
        out = np.empty(bits.shape, int_type)
    if sign is None:
        sign = np.empty(bits.shape, int_type)
    np.right_shift(bits, bits.itemsize * 8 - 1, out=sign)  # 0, or -1 when negative
    np.bitwise_and(bits, int_type(magnitude), out=out)
    # Two's complement negation where sign is -1: (m ^ -1) - (-1) == ~m + 1 == -m.
    np.bitwise_xor(out, sign, out=out)
    np.subtract(out, sign, out=out)
    return out


def rank_distance(ranks_a: np.ndarray, ranks_b: np.ndarray,
                  out: np.ndarray | None = None) -> np.ndarray:
    """``|ranks_a - ranks_b|`` exactly, as the unsigned integer of the ranks' width.

    Overwrites ``ranks_a``. The larger minus the smaller wraps around in the signed width
    but is exact once read as unsigned, since it is below ``2**bits``.
    """
    if out is None:
        out = np.empty_like(ranks_a)
    np.maximum(ranks_a, ranks_b, out=out)
    np.minimum(ranks_a, ranks_b, out=ranks_a)
    np.subtract(out, ranks_a, out=out)
    return out.view(f"u{out.dtype.itemsize}")


def ulp_distance(a: np.ndarray, b: np.ndarray, dtype: str) -> np.ndarray:
    """Element-wise ULP distance as uint64 (NaN positions give meaningless counts: mask them).

    ``a`` and ``b`` hold values of ``dtype`` (float32 arrays for bfloat16).
    """
    distance = rank_distance(ulp_ranks(a, dtype), ulp_ranks(b, dtype)).astype(np.uint64)
    return distance >> np.uint64(ulp_shift(dtype))


def max_ulp_distance(a: np.ndarray, b: np.ndarray, dtype: str,
                     comparable: np.ndarray | None = None,
                     scratch: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
                     ) -> int | None:
    """The largest ``ulp_distance`` over the positions where ``comparable`` is true (all of
    them by default; None where there is none), as an exact integer.

    ``scratch``: three arrays of ``rank_dtype(dtype)`` and the values' length, reused
    instead of allocating (the chunked comparison passes its own).
    """
    float_type, int_type, _ = _layout(dtype)
    shift = ulp_shift(dtype)
    if np.size(a) == 0:
        return None
    if scratch is None:
        scratch = (np.empty(np.shape(a), int_type), np.empty(np.shape(a), int_type),
                   np.empty(np.shape(a), int_type))
    out_a, out_b, out = scratch
    if comparable is None:
        bits_a = np.ascontiguousarray(a, dtype=float_type).view(int_type)
        bits_b = np.ascontiguousarray(b, dtype=float_type).view(int_type)
        if shift:  # bfloat16: its pattern is the upper half
            bits_a = np.bitwise_and(bits_a, int_type(-1 << shift), out=out_a)
            bits_b = np.bitwise_and(bits_b, int_type(-1 << shift), out=out_b)
        if np.bitwise_xor(bits_a, bits_b, out=out).min() >= 0:
            # No pair differs in sign (the usual case): the patterns' difference is the
            # ranks' difference, and it cannot overflow.
            difference = np.subtract(bits_a, bits_b, out=out)
            return max(int(difference.max()), -int(difference.min())) >> shift
    ranks_a = ulp_ranks(a, dtype, out=out_a, sign=out)
    ranks_b = ulp_ranks(b, dtype, out=out_b, sign=out)
    distance = rank_distance(ranks_a, ranks_b, out=out)
    if comparable is not None:
        distance = distance[comparable]
    return int(distance.max()) >> shift if distance.size else None
