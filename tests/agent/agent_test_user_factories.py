"""User workloads (`module:factory`) for the agent's tests of design §2.2's user hook."""

import torch
from torch import nn

from numparity_agent.testing import Train


def raising():
    raise ValueError("the lab's checkpoint is missing")


def tiny():
    """A model and inputs built from torch tensors only (exact integer arithmetic)."""
    model = nn.Sequential(nn.Linear(8, 4), nn.Tanh(), nn.Linear(4, 2))
    with torch.no_grad():
        for i, param in enumerate(model.parameters()):
            n = param.numel()
            ints = (torch.arange(n, dtype=torch.int64) * 7919 + 104729 * (i + 1)) % 2001
            param.copy_(((ints - 1000).to(torch.float32) / 4096).reshape(param.shape))
    x = ((torch.arange(3 * 8, dtype=torch.int64) * 31) % 17 - 8).to(torch.float32) / 8
    return model, {"x": x.reshape(3, 8)}


class OverflowingTrain(Train):
    """`train` with a loss scale so large that fp16 gradients overflow: every step of
    fp16-autocast is skipped by the GradScaler."""

    name = "train-overflow"
    init_scale = 2.0**100


def train_overflow():
    return OverflowingTrain()
