"""The `large` suite: production shapes for GPU nodes (design §2.2), versioned apart from
`standard` (its results say `suite: "large"`, its streams start `large/`).

- `gemm`: A (4096 x 8192) @ B (8192 x 4096), and the square 4096^3 product of A's first
  4096 columns and B's first 4096 rows (copied contiguous): `square`, `long_k`;
- `resnet_block`: a ResNet-50 bottleneck at 256 x 56 x 56 (1x1 256->64, 3x3 64->64,
  1x1 64->256, each with eval-mode batch norm; ReLU after the residual sum), batch 8;
- `attention`: causal scaled_dot_product_attention, batch 2, 8 heads, sequence 2048,
  head dim 128 (`sdpa`), then through each backend alone against math (`sdpa.<backend>`,
  field `checks.attention_backends_agree`, as `decoder` does);
- `decoder`: the standard decoder at d_model 1024, 8 layers of 8 heads of 128, SwiGLU
  2816, vocab 4096, a prefill of 128 tokens, with its three checks;
- `train`: `train`'s Adam at 20 steps of an MLP 1024-2048-1000, batch 256.

The GEMMs do not compute each dtype themselves: they run under the variants as every
workload does, built in float32, and the variant picks the arithmetic — fp32 (`default`,
`strict`), TF32 (`tf32`), fp16 and bf16 (the autocast variants). So a GEMM's answers
are grouped and judged per variant like any other, and a variant knob never meets a
dtype it was not made for. `fp64-reference` runs only when named: on the node's CPU it
takes minutes.

Inputs and weights come from the portable generator (design §2.1); the tensors of
millions of elements are uniform (a bell value costs twelve draws): the GEMM operands in
[-1, 1), the block's input in [0, 1) as a ReLU's output is, q, k and v in [-2, 2).

Sizes, FLOPs and the A100 estimate per workload: `_sizes` (`numparity-agent suites`).
Each class takes its size, so tests build the same definitions small.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from numparity_agent._workloads import LARGE as SUITE
from numparity_agent._workloads._base import (
    Built,
    Recorder,
    Workload,
    init_default_,
    layer_hooks,
    place,
    uniform_tensor,
)
from numparity_agent._workloads._sizes import (
    LARGE_ATTENTION,
    LARGE_BOTTLENECK,
    LARGE_DECODER,
    LARGE_GEMM,
    LARGE_TRAIN,
    AttentionSize,
    BottleneckSize,
    GEMMSize,
    TrainSize,
)
from numparity_agent._workloads.decoder import Decoder, attention_backends
from numparity_agent._workloads.train import Train


class _Inputs(nn.Module):
    """No parameters: a workload that computes on its inputs alone."""


class GEMM(Workload):
    suite = SUITE
    warmup = False  # one evaluation costs seconds: its first is recorded
    name = "gemm"
    version = 1
    compilable = False  # its products are called directly, outside a model

    def __init__(self, size: GEMMSize = LARGE_GEMM) -> None:
        self.size = size

    def build(self, *, dtype: torch.dtype, device: torch.device) -> Built:
        size = self.size
        inputs = {"a": uniform_tensor(self, "input.a", (size.m, size.k), -1.0, 1.0),
                  "b": uniform_tensor(self, "input.b", (size.k, size.n), -1.0, 1.0)}
        return place(Built(model=_Inputs(), inputs=inputs), dtype=dtype, device=device)

    def run(self, built: Built, recorder: Recorder) -> None:
        a, b, k = built.inputs["a"], built.inputs["b"], self.size.k_square
        with torch.no_grad():
            recorder.record("square", "output", a[:, :k].contiguous() @ b[:k].contiguous())
            recorder.record("long_k", "output", a @ b)


class _BottleneckBlock(nn.Module):
    def __init__(self, size: BottleneckSize) -> None:
        super().__init__()
        c, w = size.channels, size.width
        self.conv1 = nn.Conv2d(c, w, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(w)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(w, w, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(w)
        self.relu2 = nn.ReLU()
        self.conv3 = nn.Conv2d(w, c, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(c)
        self.relu3 = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu1(self.bn1(self.conv1(x)))
        out = self.relu2(self.bn2(self.conv2(out)))
        return self.relu3(self.bn3(self.conv3(out)) + x)


class Bottleneck(Workload):
    """Recorded: each convolution and the block's output. Batch norm and ReLU are
    element-wise and follow from them; fingerprinting an activation of 6-26 million
    elements costs the host about a second each, so they are not recorded."""

    suite = SUITE
    name = "resnet_block"
    version = 1
    warmup = False
    recorded = ("conv1", "conv2", "conv3")

    def __init__(self, size: BottleneckSize = LARGE_BOTTLENECK) -> None:
        self.size = size

    def build(self, *, dtype: torch.dtype, device: torch.device) -> Built:
        size = self.size
        model = _BottleneckBlock(size)
        init_default_(model, self)
        # Running statistics and affine parameters of a trained network's order, so that
        # each batch norm scales and shifts (its default init is nearly the identity).
        with torch.no_grad():
            for name, module in model.named_modules():
                if isinstance(module, nn.BatchNorm2d):
                    shape = (module.num_features,)
                    for field, low, high in (("running_mean", -0.1, 0.1),
                                             ("running_var", 0.5, 1.5),
                                             ("weight", 0.5, 1.5), ("bias", -0.1, 0.1)):
                        getattr(module, field).copy_(
                            uniform_tensor(self, f"{name}.{field}", shape, low, high))
        model.eval()
        x = uniform_tensor(self, "input.x",
                           (size.batch, size.channels, size.spatial, size.spatial), 0.0, 1.0)
        return place(Built(model=model, inputs={"x": x}), dtype=dtype, device=device)

    def run(self, built: Built, recorder: Recorder) -> None:
        model: Any = built.model
        hooked = nn.ModuleDict({name: getattr(model, name) for name in self.recorded})
        with torch.no_grad(), layer_hooks(hooked, recorder):
            output = model(built.inputs["x"])
        recorder.record("output", "output", output)


class Attention(Workload):
    suite = SUITE
    warmup = False
    name = "attention"
    version = 1
    compilable = False  # SDPA and its backends are called directly, outside a model

    def __init__(self, size: AttentionSize = LARGE_ATTENTION) -> None:
        self.size = size

    def build(self, *, dtype: torch.dtype, device: torch.device) -> Built:
        size = self.size
        shape = (size.batch, size.heads, size.seq, size.head_dim)
        inputs = OrderedDict((name, uniform_tensor(self, f"input.{name}", shape, -2.0, 2.0))
                             for name in ("q", "k", "v"))
        return place(Built(model=_Inputs(), inputs=dict(inputs)), dtype=dtype, device=device)

    def run(self, built: Built, recorder: Recorder) -> None:
        q, k, v = built.inputs["q"], built.inputs["k"], built.inputs["v"]
        with torch.no_grad():
            recorder.record("sdpa", "output", F.scaled_dot_product_attention(
                q, k, v, is_causal=True))
            checks = {"attention_backends_agree": attention_backends((q, k, v), recorder)}
        recorder.fields["checks"] = checks


class LargeDecoder(Decoder):
    suite = SUITE
    warmup = False
    size = LARGE_DECODER


class LargeTrain(Train):
    suite = SUITE
    warmup = False

    def __init__(self, size: TrainSize = LARGE_TRAIN) -> None:
        self.size = size
        self.batch, self.features, self.steps = size.batch, size.features, size.steps
