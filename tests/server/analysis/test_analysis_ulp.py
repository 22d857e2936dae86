"""ULP distance against independent oracles: numpy's nulp_diff and torch's bfloat16."""

import numpy as np
import pytest
import torch

# numpy 2 no longer re-exports nulp_diff from numpy.testing; it still lives here.
from numpy.testing._private.utils import nulp_diff

from numparity_server.analysis import ulp_distance
from numparity_server.analysis.ulp import max_ulp_distance

SPECIAL = {
    "float16": [0.0, -0.0, 6e-8, -6e-8, 6.1e-5, 1.0, -1.0, 65504.0, -65504.0, np.inf, -np.inf],
    "float32": [0.0, -0.0, 1e-45, -1e-45, 1.2e-38, 1.0, -1.0, 3.4e38, np.inf, -np.inf],
    "float64": [0.0, -0.0, 5e-324, -5e-324, 2.2e-308, 1.0, -1.0, 1.7e308, np.inf, -np.inf],
}


def _agrees_with_nulp_diff(a: np.ndarray, b: np.ndarray, dtype: str) -> None:
    ours = ulp_distance(a, b, dtype)
    oracle = nulp_diff(a, b).ravel()
    # nulp_diff returns the count in the float dtype itself (rounded), computed in the
    # dtype's integer width: compare where that width cannot wrap around.
    bits = np.iinfo(np.dtype(dtype.replace("float", "int"))).bits
    fits = ours < 2 ** (bits - 1)
    assert fits.any()
    assert np.array_equal(ours[fits].astype(dtype), oracle[fits])


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_special_values_match_nulp_diff(dtype):
    special = np.array(SPECIAL[dtype], dtype=dtype)
    a, b = np.meshgrid(special, special)
    _agrees_with_nulp_diff(a.ravel(), b.ravel(), dtype)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_random_neighbours_and_subnormals_match_nulp_diff(dtype, rng):
    info = np.finfo(dtype)
    base = (rng.standard_normal(2000) * rng.choice([1e-3, 1.0, 1e3], 2000)).astype(dtype)
    steps = rng.integers(-300, 300, 2000)
    near = base.copy()
    for _ in range(3):  # walk a few ULPs with nextafter: an independent definition
        direction = np.where(steps > 0, np.inf, -np.inf).astype(dtype)
        near = np.where(steps != 0, np.nextafter(near, direction), near).astype(dtype)
    subnormal = (rng.integers(-50, 50, 2000) * info.smallest_subnormal).astype(dtype)
    a = np.concatenate([base, base, subnormal, subnormal])
    b = np.concatenate([near, -base, -subnormal, subnormal[::-1]])
    _agrees_with_nulp_diff(a, b, dtype)


def test_zero_signs_and_infinity_counts():
    assert ulp_distance(np.float32([0.0]), np.float32([-0.0]), "float32")[0] == 0
    tiny = np.finfo(np.float32).smallest_subnormal
    assert ulp_distance(np.float32([tiny]), np.float32([-tiny]), "float32")[0] == 2
    big = np.finfo(np.float32).max
    assert ulp_distance(np.float32([big]), np.float32([np.inf]), "float32")[0] == 1


def _bfloat16_ranks():
    """Every non-NaN bfloat16, sorted; the rank of a value is its ULP position."""
    every = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    ordered = torch.unique(every[~torch.isnan(every)].float())  # sorted; -0 and +0 merge
    return ordered


def test_bfloat16_ulp_counts_bfloat16_steps(rng):
    ordered = _bfloat16_ranks()
    picks_a = rng.integers(0, ordered.numel(), 5000)
    offsets = rng.integers(-40, 40, 5000)
    picks_b = np.clip(picks_a + offsets, 0, ordered.numel() - 1)
    far = rng.integers(0, ordered.numel(), 5000)
    picks_a = np.concatenate([picks_a, picks_a])
    picks_b = np.concatenate([picks_b, far])
    a = ordered[torch.from_numpy(picks_a)].numpy()
    b = ordered[torch.from_numpy(picks_b)].numpy()
    oracle = np.abs(picks_a - picks_b)
    assert np.array_equal(ulp_distance(a, b, "bfloat16").astype(np.int64), oracle)


def test_bfloat16_nextafter_is_one_ulp():
    start = torch.tensor([1.0, -3.5, 0.0, 1e-38, 3.0e38], dtype=torch.bfloat16)
    up = torch.nextafter(start, torch.full_like(start, float("inf")))
    ours = ulp_distance(start.float().numpy(), up.float().numpy(), "bfloat16")
    assert ours.tolist() == [1] * 5


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("signs", ["same", "mixed"])
def test_max_ulp_distance_is_the_largest_element_wise_distance(dtype, signs, rng):
    # Checked against ulp_distance, which the tests above check against the oracles.
    # bfloat16 arrays here are any float32 (the lower half must be ignored, not rounded).
    held = np.float32 if dtype == "bfloat16" else dtype
    b = (rng.standard_normal(3000) * rng.choice([1e-3, 1.0, 1e3], 3000)).astype(held)
    a = (b * (1 + rng.standard_normal(3000) * 1e-2)).astype(held)
    if signs == "same":
        a = np.copysign(a, b)
    else:
        a[::7] = -a[::7]
    expected = int(ulp_distance(a, b, dtype).max())
    assert max_ulp_distance(a, b, dtype) == expected
    assert max_ulp_distance(b, a, dtype) == expected
    comparable = rng.random(3000) < 0.5
    assert max_ulp_distance(a, b, dtype, comparable) == int(
        ulp_distance(a, b, dtype)[comparable].max())
    assert max_ulp_distance(a, b, dtype, np.zeros(3000, dtype=bool)) is None
