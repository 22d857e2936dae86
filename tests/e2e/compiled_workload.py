"""A user workload made for Inductor to compute otherwise than eager (design §2.14).

`crafted`: a projection, a LayerNorm, a softmax over 512 columns and a row sum: the
reductions whose order a fused kernel chooses (Welford statistics, the softmax's max
and sum, a long sum) are where compiled and eager part on a CPU. Small, so a compile
costs seconds once Inductor's cache holds it, and every tensor (8 × 512) is small
enough for the run document to carry its values. Whether its bits differ on this machine
is measured by the tests, never assumed.

`casts`: a projection and a chain of elementwise ops in bfloat16. Eager rounds each op's
result to bfloat16; Inductor fuses the chain and keeps it in float32 unless
`emulate_precision_casts` is on (pytorch/pytorch#183761), so that setting is the one a
lab would expect to restore eager's bits (`explain --target eager`). Whether it does on
this machine, the tests ask torch.
"""

from __future__ import annotations

import torch
from torch import nn

WIDTH = 512


class RowSum(nn.Module):
    """x.sum(-1, keepdim=True) scaled: a plain reduction as a leaf of its own."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * 3.0).sum(-1, keepdim=True) / 7.0


class Crafted(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(32, WIDTH)
        self.norm = nn.LayerNorm(WIDTH)
        self.soft = nn.Softmax(dim=-1)
        self.total = RowSum()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.soft(self.norm(self.proj(x)) * 4.0)
        return y * 100.0 + self.total(y * y)


def crafted() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(45)
    model = Crafted()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.rand(parameter.shape, generator=generator) * 2 - 1)
    return model, {"x": torch.randn(8, 32, generator=generator) * 3}


class HalfSquare(nn.Module):
    """Scaled twice and squared in bfloat16: each op rounded to bfloat16 in eager."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.to(torch.bfloat16)
        return ((h * 1.7 * 2.3) ** 2).to(torch.float32)


class Casts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(32, 64)
        self.square = HalfSquare()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.square(self.proj(x))


def casts() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(183761)
    model = Casts()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.rand(parameter.shape, generator=generator) * 2 - 1)
    return model, {"x": torch.randn(8, 32, generator=generator) * 3}
