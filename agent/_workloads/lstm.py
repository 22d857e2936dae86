"""`lstm`: one LSTM layer and a linear head on the last time step (design §2.2).

The hooks record the LSTM's output sequence and its final state as `lstm.output`,
`lstm.h` and `lstm.c` (cuDNN's LSTM on GPUs, oneDNN's or ATen's on CPUs).
"""

from __future__ import annotations

import torch
from torch import nn

from numparity_agent._workloads._base import Built, Workload, bell_tensor, init_default_, place

BATCH = 8
SEQ = 32
INPUT = 32
HIDDEN = 64
CLASSES = 10


class LSTMClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(INPUT, HIDDEN, num_layers=1, batch_first=True)
        self.head = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _state = self.lstm(x)
        return self.head(out[:, -1])


class LSTM(Workload):
    name = "lstm"
    version = 1

    def build(self, *, dtype: torch.dtype, device: torch.device) -> Built:
        model = LSTMClassifier()
        init_default_(model, self)
        model.eval()
        x = bell_tensor(self, "input.x", (BATCH, SEQ, INPUT))
        return place(Built(model=model, inputs={"x": x}), dtype=dtype, device=device)
