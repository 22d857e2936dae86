"""`probes`: single operations, each exposing one known cause of divergence (design §2.2).

Every probe output is a tensor of kind "probe":
- `matmul_large_k` — 64x16384 @ 16384x64: TF32 / bf16-matmul and blocking of the long
  reduction;
- `conv2d` — a 3x3 convolution: the cuDNN / oneDNN algorithm choice;
- `sum_long` — the sum of 2**20 elements: reduction order (threads, vector width);
- `index_add_repeated` — index_add_ with many repeated indices: atomics on GPUs;
- `cumsum` — a running sum of 2**17 positive values: the scan algorithm;
- `softmax_fp16.logits_fp64`, `softmax_fp16.logits`, `softmax_fp16` — attention-like
  logits of fp16 inputs whose values exceed the fp16 range: exact in float64 (stats
  `fp16_overflow`), inf in fp16 (stats `inf`), and the NaN rows softmax makes of them;
- `layer_norm_fp16`, `layer_norm_fp16_manual` — LayerNorm in fp16 with eps 1e-8, which
  is 0 in fp16: F.layer_norm (accumulates in fp32 internally) and the textbook
  formula in fp16, where a constant row becomes 0/0 = NaN.

The fp32 probes follow the variant (its dtype, its autocast); the fp16 probes run in
fp16 whatever the variant, with autocast off, since they exist to show fp16 behaviour.
An fp16 operation this torch or device does not implement is skipped with the reason
(result field "probes": {"skipped": {...}}); the other probes still run.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from numparity_agent._workloads._base import (
    Built,
    Recorder,
    Workload,
    bell_tensor,
    class_labels,
    uniform_tensor,
)

MATMUL = (64, 16384, 64)  # M, K, N
CONV = (8, 16, 32, 32, 32)  # batch, in channels, height, width, out channels
SUM_N = 1 << 20
INDEX_ADD = (1 << 17, 1024)  # source length, target length (~128 hits per target)
CUMSUM_N = 1 << 17
SOFTMAX = (64, 256, 256)  # queries, d, keys
SOFTMAX_STD = 36.0  # logits of std 36*36*16 ~ 20736: ~0.16% beyond fp16 max, ~1 row in 5
LAYER_NORM = (64, 256)
LAYER_NORM_EPS = 1e-8


class Probes(Workload):
    name = "probes"
    version = 1
    compilable = False  # each probe calls its op directly

    def build(self, *, dtype: torch.dtype, device: torch.device) -> Built:
        m, k, n = MATMUL
        batch, c_in, height, width, c_out = CONV
        bound = 1.0 / math.sqrt(c_in * 9)
        q_n, d, keys = SOFTMAX
        floats = {
            "matmul.a": uniform_tensor(self, "input.matmul.a", (m, k), -1.0, 1.0),
            "matmul.b": uniform_tensor(self, "input.matmul.b", (k, n), -1.0, 1.0),
            "conv2d.x": uniform_tensor(self, "input.conv2d.x", (batch, c_in, height, width), -1, 1),
            "conv2d.w": uniform_tensor(self, "input.conv2d.w", (c_out, c_in, 3, 3), -bound, bound),
            "sum_long.x": uniform_tensor(self, "input.sum_long.x", (SUM_N,), -1.0, 1.0),
            "index_add.source": uniform_tensor(
                self, "input.index_add.source", (INDEX_ADD[0],), -1.0, 1.0
            ),
            "cumsum.x": uniform_tensor(self, "input.cumsum.x", (CUMSUM_N,), 0.0, 1.0),
        }
        inputs = {name: t.to(dtype).to(device) for name, t in floats.items()}
        inputs["index_add.index"] = class_labels(
            self, "input.index_add.index", INDEX_ADD[0], INDEX_ADD[1]
        ).to(device)
        # fp16 inputs: float32 values rounded once to fp16 (IEEE round-to-nearest-even,
        # the same everywhere), whatever the variant's dtype.
        q = bell_tensor(self, "input.softmax_fp16.q", (q_n, d), std=SOFTMAX_STD)
        kt = bell_tensor(self, "input.softmax_fp16.k", (d, keys), std=SOFTMAX_STD)
        inputs["softmax_fp16.q"] = q.to(torch.float16).to(device)
        inputs["softmax_fp16.k"] = kt.to(torch.float16).to(device)
        inputs["layer_norm_fp16.x"] = _layer_norm_input(self).to(torch.float16).to(device)
        return Built(model=nn.Module().to(device), inputs=inputs)

    def run(self, built: Built, recorder: Recorder) -> None:
        x = built.inputs
        with torch.no_grad():
            recorder.record("matmul_large_k", "probe", x["matmul.a"] @ x["matmul.b"])
            recorder.record("conv2d", "probe", F.conv2d(x["conv2d.x"], x["conv2d.w"], padding=1))
            recorder.record("sum_long", "probe", x["sum_long.x"].sum())
            target = torch.zeros(INDEX_ADD[1], dtype=x["index_add.source"].dtype)
            target = target.to(x["index_add.source"].device)
            target.index_add_(0, x["index_add.index"], x["index_add.source"])
            recorder.record("index_add_repeated", "probe", target)
            recorder.record("cumsum", "probe", x["cumsum.x"].cumsum(0))
            device_type = x["softmax_fp16.q"].device.type
            with torch.autocast(device_type, enabled=False):
                fields = _fp16_probes(x, recorder)
        recorder.fields["probes"] = fields


def _layer_norm_input(workload: Workload) -> torch.Tensor:
    """Rows 0-15 constant (variance 0), rows 16-31 with a variance of about 2**-20
    (below fp16's normal range), the rest bell-shaped."""
    rows, cols = LAYER_NORM
    x = bell_tensor(workload, "input.layer_norm_fp16.x", (rows, cols))
    x[:16] = x[:16, :1].expand(16, cols)
    x[16:32] = 1.0 + x[16:32] * 2.0**-10  # exact scaling, one rounding in the add
    return x


def _fp16_probes(x: dict[str, torch.Tensor], recorder: Recorder) -> dict[str, object]:
    skipped: dict[str, str] = {}

    def probe(name: str, compute: Callable[[], torch.Tensor]) -> torch.Tensor | None:
        try:
            value = compute()
        except (RuntimeError, NotImplementedError) as exc:
            skipped[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
            return None
        recorder.record(name, "probe", value)
        return value

    q, k = x["softmax_fp16.q"], x["softmax_fp16.k"]
    probe("softmax_fp16.logits_fp64", lambda: q.double() @ k.double())
    logits = probe("softmax_fp16.logits", lambda: q @ k)
    probs = None
    if logits is not None:
        probs = probe("softmax_fp16", lambda: torch.softmax(logits, dim=-1))
    else:
        skipped["softmax_fp16"] = "no fp16 logits (see softmax_fp16.logits)"

    ln_x = x["layer_norm_fp16.x"]
    eps16 = torch.tensor(LAYER_NORM_EPS, dtype=torch.float16)
    probe("layer_norm_fp16", lambda: F.layer_norm(ln_x, ln_x.shape[-1:], eps=LAYER_NORM_EPS))

    def manual() -> torch.Tensor:
        mean = ln_x.mean(-1, keepdim=True)
        var = ((ln_x - mean) ** 2).mean(-1, keepdim=True)
        return (ln_x - mean) / torch.sqrt(var + eps16.to(ln_x.device))

    manual_ln = probe("layer_norm_fp16_manual", manual)
    fields: dict[str, object] = {
        "fp16_eps_underflow": bool(eps16.item() == 0.0),
        "layer_norm_eps": LAYER_NORM_EPS,
        "layer_norm_eps_fp16": float(eps16.item()),
        "softmax_fp16_overflow": None if logits is None else int(torch.isinf(logits).sum()),
        "softmax_fp16_nan": None if probs is None else int(torch.isnan(probs).sum()),
        "layer_norm_fp16_manual_nan": (
            None if manual_ln is None else int(torch.isnan(manual_ln).sum())
        ),
    }
    if skipped:
        fields["skipped"] = skipped
    return fields
