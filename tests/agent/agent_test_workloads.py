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


def _autocast_fp16() -> bool:
    """Under the fp16-autocast variant on the CPU (the variants that share a child)."""
    return torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.float16


class _MisbehavingUnderFp16(_Misbehaving):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _autocast_fp16():
            if self.action == "crash":
                os.abort()
            time.sleep(600)
        return self.linear(x)


def crash_in_fp16_autocast():
    return _MisbehavingUnderFp16("crash"), _inputs()


def hang_in_fp16_autocast():
    return _MisbehavingUnderFp16("hang"), _inputs()


_calls = {"build": 0, "run": 0}


class _Drifting(nn.Module):
    """Each run adds how many runs came before: a node whose repeats disagree."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 2)
        with torch.no_grad():
            self.linear.weight.copy_(torch.from_numpy(portable_uniform(0, "tests/w", (2, 4))))
            self.linear.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _calls["run"] += 1
        return self.linear(x) + (_calls["run"] - 1)


def drifting_output():
    return _Drifting(), _inputs()


def drifting_params():
    """Each build's bias is one more than the last: building is not deterministic."""
    _calls["build"] += 1
    model = nn.Linear(4, 2)
    with torch.no_grad():
        model.weight.copy_(torch.from_numpy(portable_uniform(0, "tests/w", (2, 4))))
        model.bias.fill_(float(_calls["build"]))
    return model, _inputs()
