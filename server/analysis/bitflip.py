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
    if not (reference.has_values and candidate.has_values) or reference.shape != candidate.shape:
        return None
    # Chunk by chunk (stored values are decoded so): at the second differing element, no.
    found: tuple[int, np.ndarray, np.ndarray] | None = None
    start = 0
    for a, b in zip(reference.value_chunks(), candidate.value_chunks(), strict=True):
        if (a.dtype != b.dtype or not np.issubdtype(a.dtype, np.floating)
                or a.dtype.itemsize not in _UINT):
            return None
        unsigned = _UINT[a.dtype.itemsize]
        bits_a = np.ascontiguousarray(a).view(unsigned)
        bits_b = np.ascontiguousarray(b).view(unsigned)
        differ = np.flatnonzero(bits_a != bits_b)
        if differ.size > 1 or (differ.size and found is not None):
            return None
        if differ.size:
            k = int(differ[0])
            found = (start + k, a[k:k + 1].copy(), b[k:k + 1].copy())
        start += a.size
    if found is None:
        return None
    index, a_value, b_value = found
    unsigned = _UINT[a_value.dtype.itemsize]
    xor = int(a_value.view(unsigned)[0] ^ b_value.view(unsigned)[0])
    if xor & (xor - 1):
        return None
    bit = xor.bit_length() - 1
    if reference.dtype == "bfloat16":  # held as float32: its bits are the top 16
        bit -= 16
    return {"index": index, "bit": bit, "reference": float(a_value[0]),
            "candidate": float(b_value[0])}
