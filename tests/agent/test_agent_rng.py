"""The portable generator is pinned: these numbers must never change (design §2.1)."""

import hashlib

import numpy as np

from numparity_agent import _rng

MASK = (1 << 64) - 1


def splitmix64_reference(seed: int, n: int) -> list[int]:
    """Sequential SplitMix64 in pure Python integers (Steele, Lea, Flood 2014)."""
    state, out = seed, []
    for _ in range(n):
        state = (state + 0x9E3779B97F4A7C15) & MASK
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        out.append(z ^ (z >> 31))
    return out


def test_splitmix64_first_outputs_are_pinned():
    # Seed 0's first output is the published SplitMix64 test value.
    expected = [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F, 0xF88BB8A8724C81EC]
    assert splitmix64_reference(0, 4) == expected
    assert [int(x) for x in _rng.splitmix64(0, np.arange(4))] == expected


def test_counter_evaluation_matches_sequential_reference_for_any_key():
    key = _rng.stream_key(7, "some/tensor")
    reference = splitmix64_reference(key, 1000)
    assert [int(x) for x in _rng.splitmix64(key, np.arange(1000))] == reference
    # Random access: element 998 alone is the same as in the sequence.
    assert int(_rng.splitmix64(key, np.array([998]))[0]) == reference[998]


def test_stream_key_is_sha256_of_seed_and_name():
    digest = hashlib.sha256(b"numparity/0/standard/cnn/v1/input.x").digest()
    assert _rng.stream_key(0, "standard/cnn/v1/input.x") == int.from_bytes(digest[:8], "little")
    assert _rng.stream_key(0, "standard/cnn/v1/input.x") == 0x1A1FE1FD7A801926


def test_uniform_floats_are_pinned_and_exact():
    values = _rng.uniform(0, "pin", (4,), -1.0, 1.0)
    assert values.dtype == np.float32
    assert values.tolist() == [
        0.19732558727264404,
        0.9755676984786987,
        0.27666985988616943,
        0.38655638694763184,
    ]
    # Independent recomputation: top 24 bits, exact scaling, one rounding to float32.
    raw = splitmix64_reference(_rng.stream_key(0, "pin"), 4)
    expected = [np.float32(-1.0 + 2.0 * ((x >> 40) * 2.0**-24)) for x in raw]
    assert values.tolist() == [float(x) for x in expected]


def test_bell_is_pinned_and_bell_shaped():
    assert _rng.bell(0, "pin", (3,)).tolist() == [
        0.3043472170829773,
        -1.2900917530059814,
        -0.07285559177398682,
    ]
    many = _rng.bell(0, "shape", (20000,), dtype=np.float64)
    assert abs(many.mean()) < 0.03
    assert abs(many.std() - 1.0) < 0.03
    assert many.min() >= -6.0 and many.max() <= 6.0


def test_streams_are_independent_and_prefix_stable():
    a = _rng.uniform(0, "a", (100,))
    assert not np.array_equal(a, _rng.uniform(0, "b", (100,)))
    assert not np.array_equal(a, _rng.uniform(1, "a", (100,)))
    # Growing a tensor keeps its first elements: data depends on counters, not shapes.
    assert np.array_equal(_rng.uniform(0, "a", (10, 20)).reshape(-1)[:100], a)
