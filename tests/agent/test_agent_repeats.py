"""Later repeats are checked against the first bit for bit (`same_bits`) instead of
hashed again: the verdict is the hashes' (the oracle), at memory speed on the CPU and
without a copy to the host on a GPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from numparity_agent._fingerprint import (
    bit_copy,
    fingerprint,
    fingerprints,
    same_bits,
    tensor_hash,
)
from numparity_agent.testing import load_workload, run_workload, variant

CPU = torch.device("cpu")


def _pairs() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(7, 5, generator=g)
    nan = torch.tensor([float("nan"), 1.0])
    other_nan = nan.view(torch.int32).clone()
    other_nan[0] ^= 1  # another NaN payload: not the same bits
    return [
        (x, x.clone()),
        (x, x.t().contiguous().t()),  # same values, another layout
        (x, x.t()),  # another shape
        (x, x.double()),  # another dtype
        (torch.tensor([0.0]), torch.tensor([-0.0])),  # equal as floats, not as bits
        (nan, nan.clone()),  # NaN is its own bits
        (nan, other_nan.view(torch.float32)),
        (x.bfloat16(), x.bfloat16().clone()),
        (x.bfloat16(), (x + 1e-3).bfloat16()),
        (x > 0, (x > 0).clone()),
        (x > 0, x < 0),
        (x[:, 1:4], x[:, 1:4].clone()),  # non-contiguous view
        (torch.empty(0, 3), torch.empty(0, 3)),
        (torch.arange(5, dtype=torch.int16), torch.arange(5, dtype=torch.int16)),  # 10 bytes
        (torch.arange(3, dtype=torch.uint8), torch.tensor([0, 1, 3], dtype=torch.uint8)),
    ]


@pytest.mark.parametrize("pair", range(len(_pairs())))
def test_same_bits_is_equal_hashes(pair):
    a, b = _pairs()[pair]
    assert same_bits(a, b) == (tensor_hash(a) == tensor_hash(b))
    assert same_bits(bit_copy(a), b) == same_bits(a, b)


def test_fingerprints_on_threads_are_the_fingerprints_one_by_one():
    g = torch.Generator().manual_seed(5)
    tensors = [torch.randn(n, generator=g) for n in (1, 100, 5000, 300_000)] + [
        torch.randn(64, 64, generator=g).half(), torch.randn(3, 200_000, generator=g)[:, ::3]]
    kept_one, kept_threads = {}, {}
    one = [fingerprint(t, lambda h, raw: kept_one.setdefault(h, raw.copy())) for t in tensors]
    threads = fingerprints(tensors, lambda h, raw: kept_threads.setdefault(h, raw.copy()))
    assert threads == one
    assert kept_threads.keys() == kept_one.keys() and kept_one
    for digest, raw in kept_one.items():
        np.testing.assert_array_equal(kept_threads[digest], raw)


def test_a_later_repeat_that_computes_other_bits_is_named():
    result = run_workload(load_workload("agent_test_workloads:drifting_output"),
                          variant=variant("default"), device=CPU, repeats=3)
    assert result["status"] == "ok"
    assert result["repeats_agree"] is False
    # The layer computes the same bits each time; the output drifts.
    assert result["repeats_differ"] == ["output"]


def test_a_build_that_is_not_deterministic_is_named():
    result = run_workload(load_workload("agent_test_workloads:drifting_params"),
                          variant=variant("default"), device=CPU, repeats=2)
    assert result["repeats_agree"] is False
    assert "<params>" in result["repeats_differ"] and "<inputs>" not in result["repeats_differ"]


def test_a_deterministic_workload_agrees_and_says_where_its_time_went():
    result = run_workload(load_workload("cnn"), variant=variant("default"), device=CPU,
                          repeats=2)
    assert result["repeats_agree"] is True and "repeats_differ" not in result
    timeline = result["timeline"]
    assert set(timeline) == {"build_s", "run_s", "fingerprint_s"}
    assert timeline["run_s"] == pytest.approx(sum(result["wall_s_repeats"]), abs=1e-5)
