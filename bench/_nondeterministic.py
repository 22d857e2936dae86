"""The bench's workloads for bench/determinism.py (design §2.13): a model with one
nondeterministic op in `pool`, whose deterministic implementation it uses while torch's
deterministic algorithms are on (as CUDA's `index_add_` does), and enough work around it
(`blocks`: linear layers) that making everything deterministic can cost more than making
only `pool` so."""

from __future__ import annotations

import random

import torch
from torch import nn

_ORDER = random.SystemRandom()
BUCKETS = 16


@torch.library.custom_op("numparity_bench::unordered_index_add", mutates_args=())
def unordered_index_add(rows: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    order = torch.arange(rows.shape[0])
    if not torch.are_deterministic_algorithms_enabled():
        shuffled = list(range(rows.shape[0]))
        _ORDER.shuffle(shuffled)
        order = torch.tensor(shuffled)
    out = torch.zeros(BUCKETS, rows.shape[1], dtype=rows.dtype)
    # In chunks of 8 rows, in the chosen order: what differs is the order of the sums.
    for start in range(0, rows.shape[0], 8):
        part = order[start:start + 8]
        out.index_add_(0, index[part], rows[part])
    return out


@unordered_index_add.register_fake
def _(rows: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return rows.new_empty(BUCKETS, rows.shape[1])


def _portable(shape: tuple[int, ...], salt: int, scale: float) -> torch.Tensor:
    n = 1
    for d in shape:
        n *= d
    i = torch.arange(n, dtype=torch.int64)
    ints = (i * 2654435761 + salt * 40503) % 65536
    return ((ints - 32768).to(torch.float32) / 32768 * scale).reshape(shape)


class Pool(nn.Module):
    def __init__(self, rows: int) -> None:
        super().__init__()
        self.register_buffer("index", torch.arange(rows) % BUCKETS)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return unordered_index_add(h, self.index)


class Model(nn.Module):
    def __init__(self, width: int, depth: int, rows: int) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.GELU())
                                      for _ in range(depth)])
        for i, block in enumerate(self.blocks):
            with torch.no_grad():
                block[0].weight.copy_(_portable((width, width), 2 * i, 1 / width ** 0.5))
                block[0].bias.copy_(_portable((width,), 2 * i + 1, 0.1))
        self.pool = Pool(rows)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self.blocks(x))


def pooled() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    return Model(width=384, depth=6, rows=1024), {"x": _portable((1024, 384), 99, 1.0)}


pooled.version = 1  # type: ignore[attr-defined]
