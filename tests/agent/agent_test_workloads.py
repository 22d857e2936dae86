"""User workloads (`module:factory`) for the agent's tests; loaded in variant children.

They misbehave only under `strict` (deterministic algorithms on), so a test can check
that the other variant survives.
"""

import os
import time

import torch
from torch import nn

from numparity_agent.testing import portable_uniform


class _Misbehaving(nn.Module):
    def __init__(self, action: str) -> None:
        super().__init__()
        self.action = action
        self.linear = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.are_deterministic_algorithms_enabled():
            if self.action == "crash":
                os.abort()
            time.sleep(600)
        return self.linear(x)


def _inputs() -> dict[str, torch.Tensor]:
    return {"x": torch.from_numpy(portable_uniform(0, "tests/x", (3, 4)))}


def crash_in_strict():
    return _Misbehaving("crash"), _inputs()


def hang_in_strict():
    return _Misbehaving("hang"), _inputs()
