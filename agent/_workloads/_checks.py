"""Self-consistency checks a workload reports beside its tensors (design §2.2): two ways
of computing the same numbers, compared bit for bit, with the distance in ULPs and the
relative error when they differ.

A check is `{"equal": bool, "max_ulp": int | None, "max_rel": float | None}`:
`max_ulp` the largest distance in units in the last place of the compared dtype (null
when a NaN or infinity has no match: no distance is defined), `max_rel` the largest
|a - b| / |b| over the elements where b is not 0 (null where there is none). Both are
computed here from the two tensors; the server recomputes nothing of it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

_INT_OF_SIZE = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(values: torch.Tensor) -> np.ndarray:
    """Floats as their bit patterns (NaN equals the same NaN, -0 is not +0), as numpy."""
    if not values.is_floating_point():
        return values.contiguous().numpy()
    return values.contiguous().view(_INT_OF_SIZE[values.element_size()]).numpy()


def _ordered(bits: np.ndarray, size: int) -> np.ndarray:
    """The floats' bit patterns as integers that order like the floats (two's-complement
    trick: a negative float's magnitude mirrored below zero), in int64."""
    wide = bits.astype(np.int64)
    lowest = np.int64(-(1 << (8 * size - 1)))
    return np.where(wide < 0, lowest - wide, wide)


def agreement(candidate: torch.Tensor, reference: torch.Tensor) -> dict[str, Any]:
    """How far `candidate` is from `reference` (same shape and dtype). Compared on the
    host in numpy, outside the computation under test: the comparison is the agent's
    bookkeeping, so no op of it is a workload's (a fault drill never corrupts it, and a
    GPU's fault cannot judge itself)."""
    a = candidate.detach().to("cpu").reshape(-1)
    b = reference.detach().to("cpu").reshape(-1)
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(f"cannot compare {tuple(candidate.shape)} {candidate.dtype} with "
                         f"{tuple(reference.shape)} {reference.dtype}")
    bits_a, bits_b = _bits(a), _bits(b)
    if np.array_equal(bits_a, bits_b):
        return {"equal": True, "max_ulp": 0, "max_rel": 0.0}
    if not a.is_floating_point():
        return {"equal": False, "max_ulp": None, "max_rel": None}
    # float16 and float32 widen exactly in numpy; bfloat16 (no numpy dtype) is widened
    # from its bits: the upper half of a float32.
    a64, b64 = (_float64(t, bits) for t, bits in ((a, bits_a), (b, bits_b)))
    both_nan = np.isnan(a64) & np.isnan(b64)
    finite = np.isfinite(a64) & np.isfinite(b64)
    unmatched = ~(finite | both_nan | (a64 == b64))
    max_ulp = None
    if not bool(unmatched.any()):
        size = a.element_size()
        distance = np.abs(_ordered(bits_a, size) - _ordered(bits_b, size))
        max_ulp = int(np.where(finite, distance, 0).max())
    nonzero = finite & (b64 != 0)
    with np.errstate(over="ignore"):
        max_rel = (float((np.abs(a64 - b64)[nonzero] / np.abs(b64[nonzero])).max())
                   if bool(nonzero.any()) else None)
    return {"equal": False, "max_ulp": max_ulp, "max_rel": max_rel}


def _float64(values: torch.Tensor, bits: np.ndarray) -> np.ndarray:
    if values.dtype == torch.bfloat16:
        return (bits.astype(np.uint16).astype(np.uint32) << 16).view(np.float32
                                                                     ).astype(np.float64)
    with np.errstate(invalid="ignore"):  # a signalling NaN widens quietly, still a NaN
        return values.numpy().astype(np.float64)


def worst(checks: list[dict[str, Any]]) -> dict[str, Any]:
    """Several comparisons as one: equal only if all are, the largest distances."""
    ulps = [c["max_ulp"] for c in checks]
    rels = [c["max_rel"] for c in checks if c["max_rel"] is not None]
    return {"equal": all(c["equal"] for c in checks),
            "max_ulp": None if any(u is None for u in ulps) else max(ulps, default=0),
            "max_rel": max(rels, default=None)}
