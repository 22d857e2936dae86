"""One flipped bit: what a fault drill does on purpose and a corrupting GPU by accident."""

from __future__ import annotations

from typing import Any

import numpy as np

from .fingerprint import Fingerprint

_UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}


def single_bit_flip(candidate: Fingerprint, reference: Fingerprint) -> dict[str, Any] | None:
    """``{index, bit, reference, candidate}`` when both whole values are known and differ
    in exactly one element by exactly one bit (``index`` flat, ``bit`` counted from the
    least significant bit of the tensor's dtype); else None: a rounding difference
    changes many elements, or one element by more than one bit."""
    a, b = reference.values, candidate.values
    if (a is None or b is None or a.shape != b.shape or a.dtype != b.dtype
            or not np.issubdtype(a.dtype, np.floating) or a.dtype.itemsize not in _UINT):
        return None
    unsigned = _UINT[a.dtype.itemsize]
    bits_a = np.ascontiguousarray(a).reshape(-1).view(unsigned)
    bits_b = np.ascontiguousarray(b).reshape(-1).view(unsigned)
    differ = np.flatnonzero(bits_a != bits_b)
    if differ.size != 1:
        return None
    index = int(differ[0])
    xor = int(bits_a[index] ^ bits_b[index])
    if xor & (xor - 1):
        return None
    bit = xor.bit_length() - 1
    if reference.dtype == "bfloat16":  # held as float32: its bits are the top 16
        bit -= 16
    return {"index": index, "bit": bit, "reference": float(a.reshape(-1)[index]),
            "candidate": float(b.reshape(-1)[index])}
