"""A user workload whose nondeterminism enters from host data, not from an op (tests
only; design §2.13).

`Scatter` draws a permutation of its rows from `os.urandom` in Python, makes it a tensor
(`torch.tensor`) and adds the rows into buckets by it with `index_add_`: every op is
deterministic on equal inputs, but the permutation is other bytes on every call, so the
buckets get other rows. No op's recipe helps; seeding the generator that drew it does.
"""

from __future__ import annotations

import os

import torch
from nondeterministic_workload import _portable  # its neighbour: the same weights' recipe
from torch import nn

BUCKETS = 4


class Scatter(nn.Module):
    def forward(self, h: torch.Tensor) -> torch.Tensor:
        # The permutation comes from the host: 64 random bytes, ranked.
        perm = torch.tensor(list(os.urandom(h.shape[0]))).argsort()
        index = torch.arange(h.shape[0]) % BUCKETS
        out = torch.zeros(BUCKETS, h.shape[1], dtype=h.dtype)
        return out.index_add_(0, index[perm], h)


class Bucketed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(32, 48)
        with torch.no_grad():
            self.fc.weight.copy_(_portable((48, 32), 1))
            self.fc.bias.copy_(_portable((48,), 2))
        self.scatter = Scatter()
        self.head = nn.Linear(48, 8)
        with torch.no_grad():
            self.head.weight.copy_(_portable((8, 48), 4))
            self.head.bias.copy_(_portable((8,), 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.scatter(torch.exp(self.fc(x))))


def urandom_permutation() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    return Bucketed(), {"x": _portable((64, 32), 3)}


urandom_permutation.version = 1  # type: ignore[attr-defined]


class FirstBatch(nn.Module):
    """Reads the first batch of a shuffling DataLoader over its input's rows: the
    sampler draws its order from torch's generator, which nothing seeds in between."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(32, 8)
        with torch.no_grad():
            self.fc.weight.copy_(_portable((8, 32), 1))
            self.fc.bias.copy_(_portable((8,), 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils.data import DataLoader, TensorDataset

        (batch,) = next(iter(DataLoader(TensorDataset(x), batch_size=16, shuffle=True)))
        return self.fc(batch)


def shuffled_loader() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    return FirstBatch(), {"x": _portable((64, 32), 3)}


shuffled_loader.version = 1  # type: ignore[attr-defined]
