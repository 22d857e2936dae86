"""Wire arrays (design §2.4): base64 of little-endian bytes with their dtype.

bfloat16 has no numpy dtype; it travels as its raw 16-bit patterns and is decoded to
float32 exactly (a bfloat16 is the upper half of a float32, so ``bits << 16`` loses
nothing). ``bfloat16_bits`` recovers the patterns; the ULP distance (ulp.py) reads them
in place, as the upper half of each float32.
"""

from __future__ import annotations

import base64
import binascii
import math

import numpy as np

# Names the agent writes (torch dtype names without the "torch." prefix).
_NUMPY_DTYPES: dict[str, str] = {
    "float16": "<f2",
    "float32": "<f4",
    "float64": "<f8",
    "int8": "<i1",
    "int16": "<i2",
    "int32": "<i4",
    "int64": "<i8",
    "uint8": "<u1",
    "uint16": "<u2",
    "uint32": "<u4",
    "uint64": "<u8",
    "bool": "|b1",
}
_ALIASES = {"half": "float16", "float": "float32", "double": "float64", "long": "int64",
            "int": "int32", "short": "int16"}

FLOAT_DTYPES = frozenset({"float16", "bfloat16", "float32", "float64"})
# Every dtype name a fingerprint may carry.
DTYPES = ("bfloat16", *_NUMPY_DTYPES)


def canonical_dtype(dtype: str) -> str:
    """``"torch.float32"``, ``"float"`` → ``"float32"``; ValueError for unknown names."""
    name = str(dtype).removeprefix("torch.")
    name = _ALIASES.get(name, name)
    if name != "bfloat16" and name not in _NUMPY_DTYPES:
        raise ValueError(f"unsupported dtype {dtype!r}")
    return name


def itemsize(dtype: str) -> int:
    name = canonical_dtype(dtype)
    return 2 if name == "bfloat16" else np.dtype(_NUMPY_DTYPES[name]).itemsize


def _raw_bytes(data: str | bytes | bytearray | memoryview) -> bytes:
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    if not isinstance(data, str):
        raise ValueError(f"array data must be base64 text or bytes, got {type(data).__name__}")
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"array data is not valid base64: {exc}") from None


def decode_array(
    dtype: str,
    data: str | bytes,
    shape: tuple[int, ...] | list[int] | None = None,
) -> np.ndarray:
    """Decode a wire array to a native-endian numpy array (bfloat16 → float32, exactly).

    ``data`` is base64 text or the raw bytes. With ``shape`` the array is reshaped and
    its byte length must be exactly ``prod(shape) * itemsize``; without, a flat array.
    """
    name = canonical_dtype(dtype)
    raw = _raw_bytes(data)
    size = itemsize(name)
    if shape is not None:
        shape = tuple(int(n) for n in shape)
        if any(n < 0 for n in shape):
            raise ValueError(f"negative dimension in shape {shape}")
        expected = math.prod(shape) * size
        if len(raw) != expected:
            raise ValueError(
                f"array data has {len(raw)} bytes, but {name} of shape {list(shape)} "
                f"needs {expected}"
            )
    elif len(raw) % size:
        raise ValueError(f"array data has {len(raw)} bytes, not a multiple of {name}'s {size}")

    if name == "bfloat16":
        bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32)
        array = (bits << np.uint32(16)).view(np.float32)
    else:
        wire = np.dtype(_NUMPY_DTYPES[name])
        array = np.frombuffer(raw, dtype=wire).astype(wire.newbyteorder("="))
    return array.reshape(shape) if shape is not None else array


def bfloat16_bits(values: np.ndarray) -> np.ndarray:
    """The raw bfloat16 patterns (uint16) of float32 values that hold bfloat16 numbers."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    return (bits >> np.uint32(16)).astype(np.uint16)


def float32_to_bfloat16_bits(values: np.ndarray) -> np.ndarray:
    """Round float32 to bfloat16 (nearest, ties to even, as torch does) → uint16 patterns."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + np.uint64(0x7FFF) + ((bits >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)
    patterns = rounded.astype(np.uint16)
    nan = np.isnan(np.asarray(values, dtype=np.float32))
    # Keep NaN a NaN (rounding could carry a NaN payload into the infinity pattern).
    patterns[nan] = (bits[nan] >> np.uint64(16)).astype(np.uint16) | np.uint16(0x0040)
    return patterns


def encode_array(array: np.ndarray, dtype: str | None = None) -> dict[str, str]:
    """The wire form ``{"dtype", "data"}`` of an array (the inverse of ``decode_array``).

    For ``dtype="bfloat16"`` the values are rounded to bfloat16 first.
    """
    array = np.asarray(array)
    name = canonical_dtype(dtype or array.dtype.name)
    if name == "bfloat16":
        raw = float32_to_bfloat16_bits(array.astype(np.float32)).astype("<u2").tobytes()
    else:
        raw = np.ascontiguousarray(array, dtype=np.dtype(_NUMPY_DTYPES[name])).tobytes()
    return {"dtype": name, "data": base64.b64encode(raw).decode("ascii")}
