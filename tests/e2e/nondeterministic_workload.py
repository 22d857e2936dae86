"""A user workload whose output changes from repeat to repeat (tests only).

Its last column is a sum taken in a different order on every call, the way float atomics
on a GPU add in whatever order threads arrive: the inputs and weights are the same bits
on every call, the rounding of the sum is not.
"""

from __future__ import annotations

import random

import torch
from torch import nn

_ORDER = random.SystemRandom()


def _portable(shape: tuple[int, ...], salt: int) -> torch.Tensor:
    n = 1
    for d in shape:
        n *= d
    i = torch.arange(n, dtype=torch.int64)
    ints = (i * 2654435761 + salt * 40503) % 65536
    return ((ints - 32768).to(torch.float32) / 32768).reshape(shape)


class UnorderedSum(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(32, 256)
        with torch.no_grad():
            self.fc.weight.copy_(_portable((256, 32), 1))
            self.fc.bias.copy_(_portable((256,), 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        parts = list(h.split(1, dim=1))
        _ORDER.shuffle(parts)
        total = torch.zeros_like(parts[0])
        for part in parts:
            total = total + part * 1.37
        return torch.cat([h, total], dim=1)


def unordered_sum() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    return UnorderedSum(), {"x": _portable((16, 32), 3)}


unordered_sum.version = 1  # type: ignore[attr-defined]
