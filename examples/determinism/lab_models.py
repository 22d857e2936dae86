"""Three small nondeterministic models and their fixes, as user workloads (see
docs/how-to/determinism.md and demo.py next to this file).

- `op_level`: one op (`pool`'s custom op) adds rows in a new order on every call unless
  torch's deterministic algorithms are on, as CUDA's `index_add_` does. The study names
  the op; `doctor --recipe` prints the hooks that make only `pool` deterministic.
- `host_data`: every op is deterministic, but `scatter` draws a permutation from
  `os.urandom` in Python and feeds it to `index_add_`. No op's flag helps; the study
  names where the host data enters (`aten.sort` in `scatter`) and says to draw from a
  seeded generator instead.
- `host_data_seeded`: the same model with that recipe applied: repeats agree.
"""

from __future__ import annotations

import os
import random

import torch
from torch import nn

BUCKETS = 4
_ORDER = random.SystemRandom()


def _weights(shape: tuple[int, ...], salt: int) -> torch.Tensor:
    """Fixed weights without a generator (the same bits on every node)."""
    n = 1
    for d in shape:
        n *= d
    ints = (torch.arange(n, dtype=torch.int64) * 2654435761 + salt * 40503) % 65536
    return ((ints - 32768).to(torch.float32) / 32768).reshape(shape)


@torch.library.custom_op("numparity_example::unordered_index_add", mutates_args=())
def unordered_index_add(rows: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    order = list(range(rows.shape[0]))
    if not torch.are_deterministic_algorithms_enabled():
        _ORDER.shuffle(order)  # the order float atomics would add in
    out = torch.zeros(BUCKETS, rows.shape[1], dtype=rows.dtype)
    for i in order:
        out.index_add_(0, index[i:i + 1], rows[i:i + 1])
    return out


@unordered_index_add.register_fake
def _(rows: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return rows.new_empty(BUCKETS, rows.shape[1])


class Pool(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("index", torch.arange(64) % BUCKETS)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return unordered_index_add(h, self.index)


class Scatter(nn.Module):
    def __init__(self, seed: int | None = None) -> None:
        super().__init__()
        self.seed = seed

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.seed is None:
            draws = list(os.urandom(h.shape[0]))  # host data: other bytes every call
        else:  # the recipe: a seeded generator
            draws = [random.Random(self.seed).randrange(256) for _ in range(h.shape[0])]
        perm = torch.tensor(draws).argsort()
        index = torch.arange(h.shape[0]) % BUCKETS
        out = torch.zeros(BUCKETS, h.shape[1], dtype=h.dtype)
        return out.index_add_(0, index[perm], h)


class Model(nn.Module):
    def __init__(self, middle: nn.Module, name: str) -> None:
        super().__init__()
        self.fc = nn.Linear(32, 48)
        self.head = nn.Linear(48, 8)
        with torch.no_grad():
            for i, param in enumerate([self.fc.weight, self.fc.bias, self.head.weight,
                                       self.head.bias]):
                param.copy_(_weights(tuple(param.shape), i + 1))
        self.add_module(name, middle)
        self.middle = name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.get_submodule(self.middle)(torch.exp(self.fc(x))))


def op_level() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    return Model(Pool(), "pool"), {"x": _weights((64, 32), 9)}


def host_data() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    return Model(Scatter(), "scatter"), {"x": _weights((64, 32), 9)}


def host_data_seeded() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    return Model(Scatter(seed=0), "scatter"), {"x": _weights((64, 32), 9)}


op_level.version = 1  # type: ignore[attr-defined]
host_data.version = 1  # type: ignore[attr-defined]
host_data_seeded.version = 1  # type: ignore[attr-defined]
