"""``torch.isclose`` element by element, in the arithmetic torch uses on the CPU or on a
CUDA device.

A verdict ``equivalent`` promises that ``torch.testing.assert_close(actual=a,
expected=b, equal_nan=True, rtol=…, atol=…)`` passes, and assert_close is
``torch.isclose`` over every element. isclose does not test ``|a - b| <= atol + rtol·|b|``
exactly: it computes ``actual = abs(a - b)`` and ``allowed = atol + abs(rtol * b)`` as
tensor operations in the tensor's own dtype, and calls a pair close when
``a == b``, or both are NaN (``equal_nan``), or ``actual`` is finite and at most
``allowed``. So float16's atol of 1e-5 is 1.00136e-5 once rounded, a difference that
overflows the dtype is never close, and the boundary moves by a rounding or two from
the exact one. This module computes the same operations in numpy:

- float64 and float32: every operation in the dtype (rtol and atol rounded to it once).
- float16 and bfloat16: ATen computes each operation in float32 ("opmath") and rounds
  the result to the dtype. ``rtol * b`` takes rtol as a float32 (the CPU kernel reads a
  scalar operand at opmath precision), while ``atol + …`` first rounds atol to the
  dtype (the scalar is cast to the tensor's dtype). Checked against ``torch.isclose``
  itself in the tests, on pairs at the boundary.

Two different dtypes compare as ``assert_close(check_dtype=False)`` does: both promoted
to ``torch.promote_types`` of the two (float32 for float16 with bfloat16), under the
looser of the two tolerances (the caller passes it).

**On a CUDA device** (``semantics="cuda"``) one operation differs, and only for float16
and bfloat16. ATen's isclose (aten/src/ATen/native/TensorCompare.cpp) computes
``allowed_error = atol + (rtol * other).abs()`` with ``atol`` and ``rtol`` as C++ double
scalars, each wrapped into a 0-dim CPU tensor. TensorIterator promotes such an operand to
the common dtype (float16) only when the op runs on the CPU: its "creates temporaries for
CPU operations" step is guarded by ``common_device == kCPU``. On CUDA the CPU scalar
stays a double, and the kernels read it with ``iter.scalar_value<opmath_t>()``: as a
float32 (``opmath_symmetric_gpu_kernel_with_scalars`` for mul, the ufunc-generated
``add_kernel`` for add). So on CUDA ``atol`` joins the sum as float32(atol), unrounded
to the dtype, where the CPU adds atol rounded to it. ``rtol * other`` reads rtol as
float32 on both (the CPU mul of a reduced float takes ``original_scalar_value<opmath_t>``),
and the subtraction, ``abs`` and the comparison (of two values of the dtype, exact in
float32) agree. The sum is rounded to float32 and then to the dtype on both. Near the
boundary the two atols make ``allowed`` round to neighbouring values of the dtype, so
a pair can be close on one device and not on the other; with ``rtol = 0`` the sum is
``atol`` alone and both round it alike, and float32 and float64 never differ.
"""

from __future__ import annotations

import numpy as np

from ._arrays import canonical_dtype
from .tolerance import Tolerance

_HALF = frozenset({"float16", "bfloat16"})
# Whose isclose arithmetic a comparison applies: the CPU's, or a CUDA device's (above).
SEMANTICS = ("cpu", "cuda")
_WIDTH = {"float16": 16, "bfloat16": 16, "float32": 32, "float64": 64}


def promoted_dtype(dtype_a: str, dtype_b: str) -> str:
    """``torch.promote_types`` over the float dtypes (float16 with bfloat16: float32)."""
    a, b = canonical_dtype(dtype_a), canonical_dtype(dtype_b)
    if a == b:
        return a
    if "float64" in (a, b) or a not in _WIDTH or b not in _WIDTH:
        return "float64"
    return "float32"


def _round_bfloat16(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bfloat16 (ties to even), in place; NaN and
    infinities stay what they are."""
    bits = x.view(np.uint32)
    finite = np.isfinite(x)
    # Adding 0x7FFF plus the lowest kept bit, then clearing the low half, rounds to
    # nearest-even; an overflow carries into the exponent and gives inf, as it should.
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) \
        & np.uint32(0xFFFF_0000)
    np.copyto(bits, rounded, where=finite)
    return x


def _round(x: np.ndarray, dtype: str) -> np.ndarray:
    """float32 results rounded to ``dtype`` (float16 or bfloat16), kept as float32."""
    if dtype == "float16":
        with np.errstate(over="ignore"):
            np.copyto(x, x.astype(np.float16))
        return x
    return _round_bfloat16(x)


def _scalar(value: float, dtype: str) -> np.float32:
    """A double scalar as the dtype holds it (c10::Half(double) goes through float)."""
    held = np.array([value], dtype=np.float32)
    return np.float32(_round(held, dtype)[0])


def semantics_of(device_a: str, device_b: str, *, same_device: bool) -> str:
    """The isclose arithmetic that judges two results: a CUDA device's when both were
    computed on one and the same CUDA device (`same_device`: two runs of one GPU), the
    CPU's otherwise. torch.testing.assert_close compares tensors on two devices only
    after moving both to the CPU (``check_device=False``; with it, it refuses them), and
    a lab comparing a GPU with a CPU does the same."""
    on_cuda = device_a.startswith("cuda") and device_b.startswith("cuda")
    return "cuda" if on_cuda and same_device else "cpu"


def close_count(a: np.ndarray, b: np.ndarray, dtype: str, tolerance: Tolerance,
                semantics: str = "cpu") -> int:
    """How many pairs of the finite arrays ``a`` (actual) and ``b`` (expected) isclose
    calls close (``close_mask``)."""
    return int(np.count_nonzero(close_mask(a, b, dtype, tolerance, semantics)))


def close_mask(a: np.ndarray, b: np.ndarray, dtype: str, tolerance: Tolerance,
               semantics: str = "cpu") -> np.ndarray:
    """Per pair of the finite arrays ``a`` (actual) and ``b`` (expected), whether
    isclose calls it close, computed in ``dtype`` (``promoted_dtype`` of the two sides'
    dtypes; float16 and bfloat16 values may come in any float array that holds them
    exactly) with the arithmetic of ``semantics`` ("cpu" or "cuda")."""
    name = canonical_dtype(dtype)
    rtol, atol = tolerance.rtol, tolerance.atol
    if rtol == 0 and atol == 0:  # isclose degenerates to equality
        return np.asarray(np.equal(a, b))
    work = np.float64 if name not in _WIDTH or name == "float64" else np.float32
    x = np.asarray(a, dtype=work)
    y = np.asarray(b, dtype=work)
    with np.errstate(over="ignore", invalid="ignore"):
        actual = np.subtract(x, y)
        np.abs(actual, out=actual)
        allowed = np.multiply(y, work(rtol))
        np.abs(allowed, out=allowed)
        if name in _HALF:
            _round(actual, name)
            _round(allowed, name)
            # The CPU adds atol rounded to the dtype; CUDA adds it as a float32.
            held = _scalar(atol, name) if semantics == "cpu" else np.float32(atol)
            np.add(allowed, held, out=allowed)
            _round(allowed, name)
        else:
            np.add(allowed, work(atol), out=allowed)
        close = np.less_equal(actual, allowed)
        # A difference that overflowed the dtype is inf: never close (a == b aside,
        # which finite values that differ cannot be).
        close &= np.isfinite(actual)
    return close
