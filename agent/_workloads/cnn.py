"""`cnn`: the classic MNIST CNN (design §2.2)."""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn

from numparity_agent import _rng
from numparity_agent._workloads._base import (
    SEED,
    Built,
    Workload,
    init_default_,
    place,
    stream_name,
)

BATCH = 64


class CNN(Workload):
    name = "cnn"
    version = 1

    def build(self, *, dtype: torch.dtype, device: torch.device) -> Built:
        # Leaf modules for every step, so the hooks see each layer under its name.
        model = nn.Sequential(
            OrderedDict(
                conv1=nn.Conv2d(1, 32, kernel_size=5),
                relu1=nn.ReLU(),
                pool1=nn.MaxPool2d(2),
                conv2=nn.Conv2d(32, 64, kernel_size=5),
                relu2=nn.ReLU(),
                pool2=nn.MaxPool2d(2),
                flatten=nn.Flatten(),
                fc1=nn.Linear(64 * 4 * 4, 512),
                relu3=nn.ReLU(),
                fc2=nn.Linear(512, 10),
            )
        )
        init_default_(model, self)
        model.eval()
        x = _rng.bell(SEED, stream_name(self, "input.x"), (BATCH, 1, 28, 28))
        return place(
            Built(model=model, inputs={"x": torch.from_numpy(x)}), dtype=dtype, device=device
        )
