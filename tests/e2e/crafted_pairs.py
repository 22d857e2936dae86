"""A user workload of crafted tensor pairs whose verdicts are known from torch itself.

`numparity-agent run --workloads crafted_pairs:crafted` records, as tensors of kind
"probe", side "a" or side "b" (``NUMPARITY_CRAFTED_SIDE``) of every pair in ``PAIRS``:
all four float dtypes, a small tensor (values travel whole) and a large one (more than
the 4,096 elements whose values always travel), with ±0, subnormals, ±Inf, NaN on one
or both sides, differences one ULP inside and one ULP outside torch's tolerance (found
with ``torch.isclose`` itself, element by element), single outliers and uniform errors.
A special element of a large tensor sits where the fingerprint's sample does not look.

The test builds both sides in its own process with ``pairs()`` and asks
``torch.testing.assert_close`` what the verdict must be (``tests/helpers/torch_oracle.py``,
which the agent's child imports too: the test puts tests/ on its PYTHONPATH).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
import torch
from helpers.torch_oracle import DTYPES, default_tolerance, edge, steps
from torch import nn

from numparity_agent import Built, Recorder, Workload  # what a user workload uses
from numparity_agent.testing import (
    SAMPLE_M,
    VALUES_MAX,
    sample_positions,
)

SIZES = {"small": 1000, "large": 3 * VALUES_MAX}


def _unsampled(n: int) -> int:
    """An element the fingerprint's sample does not include (any, for a small tensor)."""
    sampled = set(sample_positions(n, SAMPLE_M).tolist())
    return next(i for i in range(n // 2, n) if i not in sampled)


def _base(dtype: torch.dtype, n: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    return torch.from_numpy(rng.standard_normal(n) * scale).to(dtype)


Pair = tuple[torch.Tensor, torch.Tensor]


def _cases(dtype: torch.dtype, n: int, seed: int) -> dict[str, Pair]:
    a = _base(dtype, n, seed)
    at = _unsampled(n)
    inside = steps(a, edge(a))
    cases: dict[str, Pair] = {}
    cases["same"] = (a, a.clone())
    # Every element one step inside its tolerance: assert_close passes (and the
    # float64 test of the old server failed some of them).
    cases["edge_inside"] = (a, inside)
    one_out = inside.clone()
    one_out[at] = steps(a[at:at + 1], edge(a[at:at + 1]) + 1)[0]
    cases["one_past_edge"] = (a, one_out)
    tiny = _base(dtype, n, seed + 1, scale=float(default_tolerance(dtype)[1]))
    cases["near_zero_edge"] = (tiny, steps(tiny, edge(tiny)))
    cases["uniform_one_step"] = (a, steps(a, torch.ones_like(edge(a))))
    zeros = a.clone()
    zeros[::7] = 0.0
    negative_zeros = zeros.clone()
    negative_zeros[::7] = -0.0
    cases["signed_zeros"] = (zeros, negative_zeros)
    subnormal = torch.finfo(dtype).tiny / 4
    sub = torch.full((n,), subnormal, dtype=torch.float64).to(dtype)
    sub_b = sub.clone()
    sub_b[at] = 0.0
    cases["subnormals"] = (sub, sub_b)
    inf = a.clone()
    inf[at], inf[at // 3] = float("inf"), float("-inf")
    swapped = inf.clone()
    swapped[at], swapped[at // 3] = float("-inf"), float("inf")
    cases["inf_sign_swapped"] = (inf, swapped)
    cases["inf_both_same"] = (inf, torch.where(torch.isfinite(inf), inside, inf))
    nan = a.clone()
    nan[at] = float("nan")
    cases["nan_both"] = (nan, torch.where(torch.isnan(nan), nan, inside))
    cases["nan_one_side"] = (a, nan)
    outlier = a.clone()
    outlier[at] = outlier[at] * 2 + 1
    cases["single_outlier"] = (a, outlier)
    cases["uniform_error"] = (a, a * (1 + 10 * default_tolerance(dtype)[0]))
    return cases


def pairs() -> dict[str, Pair]:
    """Every crafted pair by tensor name (``dtype.size.case``): (side a, side b)."""
    found: dict[str, Pair] = {}
    for d_index, (d_name, dtype) in enumerate(DTYPES.items()):
        for s_index, (s_name, n) in enumerate(SIZES.items()):
            for case, pair in _cases(dtype, n, seed=100 * d_index + 10 * s_index).items():
                found[f"{d_name}.{s_name}.{case}"] = pair
    return found


class Crafted(Workload):
    name = "crafted"
    version = 1

    def build(self, *, dtype: torch.dtype, device: torch.device) -> Built:
        return Built(model=nn.Identity(), inputs={})

    def run(self, built: Built, recorder: Recorder) -> None:
        side = 0 if os.environ.get("NUMPARITY_CRAFTED_SIDE", "a") == "a" else 1
        for name, pair in pairs().items():
            recorder.record(name, "probe", pair[side])


crafted: Callable[[], Workload] = Crafted
