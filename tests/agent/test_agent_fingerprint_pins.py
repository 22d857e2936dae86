"""Pinned fingerprints: every byte of the output stays the same across agent versions.

Documents from different agent versions must stay comparable (design §2.4), so a change
to how a fingerprint is computed may make it faster but must not change a hash, a stat
value (exact float equality, last bit included), or a byte of sketch, sample or values.
The pins in data/fingerprint_pins.json were produced by the agent before its fingerprint
was optimized; regenerate them only for a deliberate format change (a new schema):

    .venv/bin/python tests/agent/test_agent_fingerprint_pins.py --write

Every tensor is built from the portable generator and exact IEEE conversions, so the
set is the same on every machine. The float64 stats depend on numpy's summation order
(pairwise sums), which numpy keeps across its releases for contiguous float64 arrays.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from numparity_agent import _rng
from numparity_agent._fingerprint import (
    combined_hash,
    count_sketch,
    fingerprint,
    sample_positions,
    tensor_hash,
    tensor_hashes,
    tensor_stats,
)

PINS = Path(__file__).parent / "data" / "fingerprint_pins.json"

SIZES = (0, 1, 63, 64, 65, 4096, 4097, 1_200_000)
FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)

# Values that hit every counter and every edge of the float stats: NaN, +-Inf, signed
# zeros, subnormals of each dtype, the fp16 overflow and underflow borders.
SPECIALS = [
    float("nan"),
    float("inf"),
    -float("inf"),
    0.0,
    -0.0,
    70000.0,
    -70000.0,
    65504.0,
    65505.0,
    1e-40,
    -1e-40,
    3e-5,
    6.0e-5,
    2.0**-14,
    2.0**-24,
    1e-310,
    -1e-310,
    5e-324,
    1e300,
    -1e-45,
]


def _values(n: int, name: str, std: float = 3.0) -> np.ndarray:
    return _rng.bell(0, f"pins/{name}", (n,), std=std, dtype=np.float64)


def _with_specials(n: int, name: str) -> torch.Tensor:
    x = _values(n, name)
    if n:
        # Scattered over the tensor (not only at its start) so every block of a
        # blockwise computation sees some.
        positions = np.linspace(0, n - 1, num=min(n, len(SPECIALS))).astype(np.int64)
        x[positions] = SPECIALS[: positions.size]
    return torch.from_numpy(x)


def _nan_payloads() -> torch.Tensor:
    bits = torch.tensor([0x7FC00000, 0x7FC00001, -0x00400000, 0x7F800001, 0], dtype=torch.int32)
    return bits.view(torch.float32)


def cases() -> Iterator[tuple[str, Callable[[], torch.Tensor]]]:
    """(name, builder) of every pinned tensor; builders so the big ones are made lazily."""
    for dtype in FLOATS:
        d = str(dtype).removeprefix("torch.")
        for n in SIZES:
            yield (
                f"{d}/plain/{n}",
                lambda n=n, dtype=dtype: torch.from_numpy(_values(n, f"plain/{n}")).to(dtype),
            )
            yield (
                f"{d}/specials/{n}",
                lambda n=n, dtype=dtype: _with_specials(n, f"sp/{n}").to(dtype),
            )
        yield f"{d}/scalar", lambda dtype=dtype: torch.tensor(2.75, dtype=dtype)
        yield (
            f"{d}/all_nonfinite",
            lambda dtype=dtype: torch.tensor(
                [float("nan"), float("inf"), -float("inf")], dtype=dtype
            ),
        )
        yield f"{d}/zeros", lambda dtype=dtype: torch.zeros(65, dtype=dtype)
        yield f"{d}/neg_zeros", lambda dtype=dtype: torch.full((70,), -0.0, dtype=dtype)
        yield f"{d}/constant", lambda dtype=dtype: torch.full((5000,), 0.1, dtype=dtype)
        # Non-contiguous views: transposed, strided, permuted 4-D, offset, broadcast.
        yield (
            f"{d}/transposed",
            lambda dtype=dtype: _with_specials(65 * 63, "tr").to(dtype).reshape(65, 63).t(),
        )
        yield f"{d}/strided", lambda dtype=dtype: _with_specials(9000, "st").to(dtype)[1::3]
        yield (
            f"{d}/permuted",
            lambda dtype=dtype: (
                _with_specials(8 * 16 * 30 * 31, "pm")
                .to(dtype)
                .reshape(8, 16, 30, 31)
                .permute(0, 2, 3, 1)
            ),
        )
        yield (
            f"{d}/channels_last",
            lambda dtype=dtype: (
                torch.from_numpy(_values(4 * 12 * 50 * 50, "cl"))
                .to(dtype)
                .reshape(4, 12, 50, 50)
                .contiguous(memory_format=torch.channels_last)
            ),
        )
        yield f"{d}/offset", lambda dtype=dtype: _with_specials(5000, "off").to(dtype)[7:4500]
        yield (
            f"{d}/broadcast",
            lambda dtype=dtype: torch.from_numpy(_values(64, "bc")).to(dtype).expand(100, 64),
        )
        yield (
            f"{d}/big_permuted",
            lambda dtype=dtype: (
                _with_specials(64 * 32 * 24 * 25, "bp")
                .to(dtype)
                .reshape(64, 32, 24, 25)
                .transpose(1, 3)
            ),
        )
    yield "float32/nan_payloads", _nan_payloads
    yield (
        "float32/requires_grad",
        lambda: torch.from_numpy(_values(300, "rg").astype(np.float32)).requires_grad_(),
    )
    yield (
        "float64/overflowing_sums",
        lambda: torch.tensor([1e308, 1.5e308, -1e308, 1.7e308], dtype=torch.float64),
    )
    yield "float32/huge_finite", lambda: torch.tensor([3e38, 3.3e38, -3.2e38], dtype=torch.float32)
    yield (
        "float32/big_mean_offset",
        lambda: torch.from_numpy((1e4 + _values(1_200_000, "off", std=1e-3)).astype(np.float32)),
    )
    for n in SIZES:
        yield (
            f"int64/{n}",
            lambda n=n: torch.from_numpy(
                np.round(_values(n, f"int/{n}", std=1e6)).astype(np.int64)
            ),
        )
    yield (
        "int64/extremes",
        lambda: torch.tensor(
            [2**63 - 1, -(2**63), 2**53 + 1, -(2**53) - 1, 0, 7], dtype=torch.int64
        ),
    )
    yield "int64/transposed", lambda: torch.arange(-300, 300, dtype=torch.int64).reshape(20, 30).t()
    for dtype in (torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool):
        d = str(dtype).removeprefix("torch.")
        yield (
            f"{d}/mixed",
            lambda dtype=dtype: torch.from_numpy(np.round(_values(5000, "small", std=40.0))).to(
                dtype
            ),
        )
    for name in ("float8_e4m3fn", "float8_e5m2"):
        if hasattr(torch, name):
            yield (
                f"{name}/specials",
                lambda name=name: _with_specials(5000, "f8").to(getattr(torch, name)),
            )


def _digest(obj: Any) -> str:
    # json.dumps writes floats with repr, which round-trips exactly (-0.0 included).
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


# Stats added after the pins were made: checked against numpy (test_signed_infinities),
# left out of what is compared with the pins, which still cover every other byte.
ADDED_STATS = ("pos_inf", "neg_inf")


def _pinned(stats: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in stats.items() if key not in ADDED_STATS}


def observe(tensor: torch.Tensor) -> dict[str, Any]:
    """Everything the agent derives from one tensor, in a JSON-comparable form."""
    entry = fingerprint(tensor)
    entry = {**entry, "stats": _pinned(entry["stats"])}
    flat = tensor.detach().to(torch.float64).reshape(-1).numpy()
    finite = np.where(np.isfinite(flat), flat, 0.0)
    return {
        "hash": entry["hash"],
        "stats": entry["stats"],
        "entry": _digest(entry),
        "tensor_hash": tensor_hash(tensor),
        "tensor_stats": _digest(_pinned(tensor_stats(tensor))),
        "count_sketch": hashlib.sha256(count_sketch(finite).tobytes()).hexdigest(),
        "sample_positions": _digest(sample_positions(tensor.numel()).tolist()),
    }


def observe_all() -> dict[str, Any]:
    observed = {name: observe(build()) for name, build in cases()}
    named = [(name, build()) for name, build in cases() if "1200000" not in name][:40]
    observed["<combined_hash>"] = {"hash": combined_hash(named)}
    return observed


@pytest.fixture(scope="module")
def pins() -> dict[str, Any]:
    return json.loads(PINS.read_text())  # type: ignore[no-any-return]


def test_every_case_is_pinned(pins):
    names = [name for name, _ in cases()]
    assert len(names) == len(set(names))
    assert sorted(pins) == sorted([*names, "<combined_hash>"])


@pytest.mark.parametrize("name,build", list(cases()), ids=[name for name, _ in cases()])
def test_fingerprint_is_bit_identical_to_the_pins(pins, name, build):
    observed = observe(build())
    pinned = pins[name]
    # Stats first, value by value, so a failure names the field (floats: exact).
    for key, value in pinned["stats"].items():
        got = observed["stats"][key]
        assert type(got) is type(value), key
        assert json.dumps(got) == json.dumps(value), (key, got, value)
    assert observed == pinned


@pytest.mark.parametrize("name,build", list(cases()), ids=[name for name, _ in cases()])
def test_signed_infinities(name, build):
    tensor = build()
    flat = tensor.detach().to(torch.float64).reshape(-1).numpy()
    stats = fingerprint(tensor)["stats"]
    assert stats["pos_inf"] == int((flat == np.inf).sum())
    assert stats["neg_inf"] == int((flat == -np.inf).sum())
    assert stats["pos_inf"] + stats["neg_inf"] == stats["inf"]


def test_combined_hash_is_pinned(pins):
    named = [(name, build()) for name, build in cases() if "1200000" not in name][:40]
    assert combined_hash(named) == pins["<combined_hash>"]["hash"]


def test_tensor_hashes_in_parallel_match_the_pins(pins):
    built = [(name, build()) for name, build in cases()]
    assert tensor_hashes([t for _, t in built]) == [pins[name]["hash"] for name, _ in built]


def test_repeated_and_interleaved_sizes_give_the_same_fingerprint():
    """Caches (sketch plans, sample positions) must not leak between tensor sizes."""
    sizes = (1_200_000, 65, 4097, 1_200_000, 0, 64, 300_000, 65)
    first = {}
    for n in sizes:
        t = _with_specials(n, f"il/{n}").float()
        entry = fingerprint(t)
        assert first.setdefault(n, entry) == entry


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(__doc__)
    PINS.parent.mkdir(exist_ok=True)
    PINS.write_text(json.dumps(observe_all(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {PINS}")
