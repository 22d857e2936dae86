"""Fingerprints checked against independent recomputations (design §2.4)."""

import base64
import hashlib
import math

import numpy as np
import pytest
import torch

from numparity_agent import _rng
from numparity_agent._fingerprint import (
    count_sketch,
    fingerprint,
    sample_positions,
    tensor_hash,
    tensor_stats,
)


def decode(array: dict) -> np.ndarray:
    raw = base64.b64decode(array["data"])
    if array["dtype"] == "bfloat16":
        return np.frombuffer(raw, dtype="<i2")
    np_dtype = np.dtype(array["dtype"]).newbyteorder("<")
    return np.frombuffer(raw, dtype=np_dtype)


def tricky_tensor(dtype: torch.dtype) -> torch.Tensor:
    values = _rng.bell(0, "tricky", (2000,), std=3.0, dtype=np.float64)
    t = torch.from_numpy(values)
    t[:6] = torch.tensor(
        [float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 70000.0], dtype=torch.float64
    )
    t[6:9] = torch.tensor([1e-40, 3e-5, -1e-310], dtype=torch.float64)
    return t.to(dtype)


def oracle_stats(t: torch.Tensor) -> dict:
    x = t.to(torch.float64).numpy()
    finite = x[np.isfinite(x)]
    tiny = torch.finfo(t.dtype).tiny
    return {
        "count": x.size,
        "nan": int(np.isnan(x).sum()),
        "inf": int(np.isinf(x).sum()),
        "pos_inf": int((x == np.inf).sum()),
        "neg_inf": int((x == -np.inf).sum()),
        "zero": int((x == 0).sum()),
        "subnormal": int(((finite != 0) & (np.abs(finite) < tiny)).sum()),
        "fp16_overflow": int((np.abs(finite) > 65504).sum()),
        "fp16_underflow": int(((finite != 0) & (np.abs(finite) < 2.0**-14)).sum()),
        "min": finite.min(),
        "max": finite.max(),
        "mean": math.fsum(finite) / finite.size,
        "std": math.sqrt(math.fsum((finite - math.fsum(finite) / finite.size) ** 2) / finite.size),
        "abs_max": np.abs(finite).max(),
        "l2": math.sqrt(math.fsum(finite * finite)),
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_stats_match_float64_oracle(dtype):
    t = tricky_tensor(dtype)
    stats, expected = tensor_stats(t), oracle_stats(t)
    assert stats.keys() == expected.keys()
    for key, value in expected.items():
        if isinstance(value, int):
            assert stats[key] == value, key
        else:
            assert stats[key] == pytest.approx(float(value), rel=1e-12, abs=1e-300), key
    assert stats["nan"] == 1 and stats["inf"] >= 2 and stats["zero"] >= 2  # fp16: 70000 -> inf


def test_subnormal_counts_follow_the_tensors_dtype():
    assert tensor_stats(torch.tensor([1e-40], dtype=torch.float32))["subnormal"] == 1
    assert tensor_stats(torch.tensor([1e-40], dtype=torch.float64))["subnormal"] == 0
    assert tensor_stats(torch.tensor([1e-5], dtype=torch.float16))["subnormal"] == 1


def test_all_nonfinite_gives_null_float_stats():
    stats = tensor_stats(torch.tensor([float("nan"), float("inf")]))
    assert stats["nan"] == 1 and stats["inf"] == 1
    assert (stats["pos_inf"], stats["neg_inf"]) == (1, 0)
    flipped = tensor_stats(torch.tensor([float("nan"), float("-inf")]))
    assert (flipped["inf"], flipped["pos_inf"], flipped["neg_inf"]) == (1, 0, 1)
    assert stats["min"] is None and stats["l2"] is None and stats["mean"] is None


def test_hash_is_sha256_of_dtype_shape_and_little_endian_bytes():
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    expected = hashlib.sha256(b"float32;2,3;" + np.arange(6, dtype="<f4").tobytes())
    assert tensor_hash(t) == expected.hexdigest()
    # Non-contiguous views hash their logical contents.
    assert tensor_hash(t.t()) == tensor_hash(t.t().contiguous())


def test_hash_distinguishes_sign_of_zero_nan_payloads_dtype_and_shape():
    zero = torch.tensor([0.0])
    assert tensor_hash(zero) != tensor_hash(torch.tensor([-0.0]))
    nan_a = torch.tensor([0x7FC00000], dtype=torch.int32).view(torch.float32)
    nan_b = torch.tensor([0x7FC00001], dtype=torch.int32).view(torch.float32)
    assert tensor_hash(nan_a) != tensor_hash(nan_b)
    assert tensor_hash(nan_a) == tensor_hash(nan_a.clone())
    assert tensor_hash(zero) != tensor_hash(zero.double())
    assert tensor_hash(torch.zeros(2, 3)) != tensor_hash(torch.zeros(3, 2))


def test_bfloat16_travels_as_raw_16_bit_patterns():
    t = torch.tensor([1.0, -2.5, float("nan")], dtype=torch.bfloat16)
    entry = fingerprint(t)
    assert entry["values"]["dtype"] == "bfloat16"
    assert decode(entry["values"]).tolist() == t.view(torch.int16).tolist()
    expected = hashlib.sha256(b"bfloat16;3;" + t.view(torch.int16).numpy().astype("<i2").tobytes())
    assert entry["hash"] == expected.hexdigest()


def test_sketch_is_linear_and_estimates_relative_l2():
    a = _rng.bell(0, "a", (50000,), dtype=np.float64)
    b = a + 0.01 * _rng.bell(0, "noise", (50000,), dtype=np.float64)
    sa, sb = count_sketch(a), count_sketch(b)
    np.testing.assert_allclose(count_sketch(a + b), sa + sb, rtol=1e-12, atol=1e-9)
    np.testing.assert_array_equal(count_sketch(2.0 * a), 2.0 * sa)
    estimate = np.linalg.norm(sa - sb) / np.linalg.norm(sb)
    truth = np.linalg.norm(a - b) / np.linalg.norm(b)
    assert abs(estimate - truth) / truth < 4 * math.sqrt(2 / 256)


def test_sample_positions_are_a_pure_function_of_numel():
    positions = sample_positions(100000)
    assert len(positions) == 64 and len(set(positions.tolist())) == 64
    assert positions.tolist() == sorted(positions.tolist())
    assert positions.max() < 100000
    assert not np.array_equal(positions, sample_positions(100001))
    assert sample_positions(10).tolist() == list(range(10))


def test_fingerprint_entry_round_trips():
    t = torch.from_numpy(_rng.bell(0, "t", (50, 100)))
    entry = fingerprint(t)
    assert entry["dtype"] == "float32" and entry["shape"] == [50, 100]
    assert entry["sketch"]["k"] == 256 and decode(entry["sketch"]).shape == (256,)
    np.testing.assert_array_equal(decode(entry["sketch"]), count_sketch(t.double().numpy()))
    sample = decode(entry["sample"])
    assert entry["sample"]["m"] == 64
    np.testing.assert_array_equal(sample, t.reshape(-1).numpy()[sample_positions(5000)])
    assert "values" not in entry
    small = fingerprint(t[:40])  # 4000 elements: values travel whole
    np.testing.assert_array_equal(decode(small["values"]), t[:40].reshape(-1).numpy())
