"""`mlp`: three linear layers with GELU (design §2.2)."""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn

from numparity_agent._workloads._base import Built, Workload, bell_tensor, init_default_, place

BATCH = 64
FEATURES = (256, 512, 512, 10)


class MLP(Workload):
    name = "mlp"
    version = 1

    def build(self, *, dtype: torch.dtype, device: torch.device) -> Built:
        d_in, h1, h2, d_out = FEATURES
        model = nn.Sequential(
            OrderedDict(
                fc1=nn.Linear(d_in, h1),
                act1=nn.GELU(),
                fc2=nn.Linear(h1, h2),
                act2=nn.GELU(),
                fc3=nn.Linear(h2, d_out),
            )
        )
        init_default_(model, self)
        model.eval()
        x = bell_tensor(self, "input.x", (BATCH, d_in))
        return place(Built(model=model, inputs={"x": x}), dtype=dtype, device=device)
