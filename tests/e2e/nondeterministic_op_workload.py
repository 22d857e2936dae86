"""User workloads with one deliberately nondeterministic op, and its deterministic twin
(tests only; design §2.13).

`lab::unordered_index_add` adds rows into buckets with `index_add_` in a new random
order on every call, the way a GPU's float atomics add in whatever order threads
arrive: the inputs are the same bits on every call, the rounding of the sums is not.
Like torch's own CUDA `index_add_`, it has a deterministic implementation (the rows in
index order) that it uses while `torch.use_deterministic_algorithms(True)` is on. It is
a custom op (`torch.library.custom_op`), so the op tracer sees it as one op, as it sees
an aten op, and names it with its module (`pool`).
"""

from __future__ import annotations

import random

import torch
from nondeterministic_workload import _portable  # its neighbour: the same weights' recipe
from torch import nn

_ORDER = random.SystemRandom()
BUCKETS = 4


@torch.library.custom_op("numparity_lab::unordered_index_add", mutates_args=())
def unordered_index_add(rows: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    order = list(range(rows.shape[0]))
    if not torch.are_deterministic_algorithms_enabled():
        _ORDER.shuffle(order)
    perm = torch.tensor(order, dtype=torch.int64)
    out = torch.zeros(BUCKETS, rows.shape[1], dtype=rows.dtype)
    # One row at a time: index_add_ over all rows at once may itself sort its work.
    for i in perm.tolist():
        out.index_add_(0, index[i:i + 1], rows[i:i + 1])
    return out


@unordered_index_add.register_fake
def _(rows: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return rows.new_empty(BUCKETS, rows.shape[1])


class BucketPool(nn.Module):
    def __init__(self, ordered: bool) -> None:
        super().__init__()
        self.ordered = ordered
        self.register_buffer("index", torch.arange(64, dtype=torch.int64) % BUCKETS)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.ordered:
            out = torch.zeros(BUCKETS, h.shape[1], dtype=h.dtype)
            return out.index_add_(0, self.index, h)
        return unordered_index_add(h, self.index)


class Pooled(nn.Module):
    def __init__(self, ordered: bool) -> None:
        super().__init__()
        self.fc = nn.Linear(32, 48)
        with torch.no_grad():
            self.fc.weight.copy_(_portable((48, 32), 1))
            self.fc.bias.copy_(_portable((48,), 2))
        self.pool = BucketPool(ordered)
        self.head = nn.Linear(48, 8)
        with torch.no_grad():
            self.head.weight.copy_(_portable((8, 48), 4))
            self.head.bias.copy_(_portable((8,), 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.pool(torch.exp(self.fc(x))))


def one_nondeterministic_op() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    return Pooled(ordered=False), {"x": _portable((64, 32), 3)}


def deterministic_twin() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    return Pooled(ordered=True), {"x": _portable((64, 32), 3)}


one_nondeterministic_op.version = 1  # type: ignore[attr-defined]
deterministic_twin.version = 1  # type: ignore[attr-defined]


@torch.library.custom_op("numparity_lab::costly_index_add", mutates_args=())
def costly_index_add(rows: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Like `unordered_index_add`, but its nondeterministic path is the fast one (the
    rows added at once, in a random order) and its deterministic one the slow one (a
    row at a time, in index order): determinism has a price to measure."""
    out = torch.zeros(BUCKETS, rows.shape[1], dtype=rows.dtype)
    if torch.are_deterministic_algorithms_enabled():
        for i in range(rows.shape[0]):
            out.index_add_(0, index[i:i + 1], rows[i:i + 1])
        return out
    order = list(range(rows.shape[0]))
    _ORDER.shuffle(order)
    perm = torch.tensor(order, dtype=torch.int64)
    return out.index_add_(0, index[perm], rows[perm])


@costly_index_add.register_fake
def _(rows: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return rows.new_empty(BUCKETS, rows.shape[1])


class CostlyPool(BucketPool):
    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return costly_index_add(h, self.index)


def costly_determinism() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    model = Pooled(ordered=False)
    model.pool = CostlyPool(ordered=False)
    return model, {"x": _portable((64, 32), 3)}


costly_determinism.version = 1  # type: ignore[attr-defined]
