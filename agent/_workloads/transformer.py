"""`transformer`: two pre-LN encoder blocks (design §2.2).

Small modules of our own rather than nn.TransformerEncoderLayer, whose fused CPU/CUDA
fast path changes with the torch release and hides the layers from the hooks. The
attention itself is a parameter-free leaf (`blocks.N.attn.sdpa`) around
F.scaled_dot_product_attention (softmax inside), so its output is fingerprinted too.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from numparity_agent._workloads._base import Built, Workload, bell_tensor, init_default_, place

BATCH = 8
SEQ = 32
D_MODEL = 64
HEADS = 4
D_FF = 256
BLOCKS = 2
CLASSES = 10


class ScaledDotProductAttention(nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v)


class SelfAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(D_MODEL, 3 * D_MODEL)
        self.sdpa = ScaledDotProductAttention()
        self.proj = nn.Linear(D_MODEL, D_MODEL)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        qkv = self.qkv(x).reshape(batch, seq, 3, HEADS, D_MODEL // HEADS)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (batch, heads, seq, d_head)
        attended = self.sdpa(q, k, v).transpose(1, 2).reshape(batch, seq, D_MODEL)
        return self.proj(attended)


class FeedForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(D_MODEL, D_FF)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(D_FF, D_MODEL)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(D_MODEL)
        self.attn = SelfAttention()
        self.ln2 = nn.LayerNorm(D_MODEL)
        self.mlp = FeedForward()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(BLOCKS))
        self.ln_f = nn.LayerNorm(D_MODEL)
        self.head = nn.Linear(D_MODEL, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


class Transformer(Workload):
    name = "transformer"
    version = 1

    def build(self, *, dtype: torch.dtype, device: torch.device) -> Built:
        model = Encoder()
        init_default_(model, self)
        model.eval()
        x = bell_tensor(self, "input.x", (BATCH, SEQ, D_MODEL))
        return place(Built(model=model, inputs={"x": x}), dtype=dtype, device=device)
