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

import torch

_INT_OF_SIZE = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def _ordered(values: torch.Tensor) -> torch.Tensor:
    """The floats' bit patterns as integers that order like the floats (two's-complement
    trick: negative floats mirrored below zero), in int64."""
    bits = values.contiguous().view(_INT_OF_SIZE[values.element_size()]).to(torch.int64)
    sign_bit = 1 << (8 * values.element_size() - 1)
    return torch.where(bits < 0, -(bits + sign_bit), bits)


def _bits(values: torch.Tensor) -> torch.Tensor:
    """Floats as their bit patterns (NaN equals the same NaN, -0 is not +0)."""
    if not values.is_floating_point():
        return values
    return values.contiguous().view(_INT_OF_SIZE[values.element_size()])


def agreement(candidate: torch.Tensor, reference: torch.Tensor) -> dict[str, Any]:
    """How far `candidate` is from `reference` (same shape and dtype)."""
    a = candidate.detach().to("cpu").reshape(-1)
    b = reference.detach().to("cpu").reshape(-1)
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(f"cannot compare {tuple(candidate.shape)} {candidate.dtype} with "
                         f"{tuple(reference.shape)} {reference.dtype}")
    equal = bool(torch.equal(_bits(a), _bits(b)))
    if equal:
        return {"equal": True, "max_ulp": 0, "max_rel": 0.0}
    if not a.is_floating_point():
        return {"equal": False, "max_ulp": None, "max_rel": None}
    both_nan = torch.isnan(a) & torch.isnan(b)
    finite = torch.isfinite(a) & torch.isfinite(b)
    unmatched = ~(finite | both_nan | (a == b))
    max_ulp = None
    if not bool(unmatched.any()):
        distance = (_ordered(a) - _ordered(b)).abs()
        max_ulp = int(torch.where(finite, distance, torch.zeros_like(distance)).max())
    a64, b64 = a.double(), b.double()
    nonzero = finite & (b64 != 0)
    max_rel = (float(((a64 - b64).abs() / b64.abs())[nonzero].max())
               if bool(nonzero.any()) else None)
    return {"equal": False, "max_ulp": max_ulp, "max_rel": max_rel}


def worst(checks: list[dict[str, Any]]) -> dict[str, Any]:
    """Several comparisons as one: equal only if all are, the largest distances."""
    ulps = [c["max_ulp"] for c in checks]
    rels = [c["max_rel"] for c in checks if c["max_rel"] is not None]
    return {"equal": all(c["equal"] for c in checks),
            "max_ulp": None if any(u is None for u in ulps) else max(ulps, default=0),
            "max_rel": max(rels, default=None)}
