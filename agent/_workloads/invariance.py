"""`invariance`: does an operation give a row the same bits alone as inside a batch
(design §2.2)?

Serving stacks batch requests; a kernel that blocks its work by the number of rows gives
a request other bits in a batch of 8 than alone, so temperature-0 answers change with
the traffic. For each operation below, row 0 is computed alone (batch 1) and inside
batches of `BATCHES`, and each is recorded (`<op>.b1`, `<op>.b8`, `<op>.b64`, kind
`probe`: `/divergence` judges them like any other tensor), and so is every row each call
computed (`<op>.batch8`, `<op>.batch64`, and the batch of 64 again, `<op>.batch64.again`):
a wrong value in any row shows against the peers, not only in row 0. The result's `invariance`
field says per op whether it is batch-invariant (every batch gives row 0 the alone
bits), the largest distance in ULPs and which batch sizes differ, and whether the batch
of 64 repeats bit for bit when run again (`repeatable`: nondeterminism, told apart from
batch dependence). Its `checks.batch_invariant` is the workload's verdict, naming the
first op that is not.

Ops: matmuls of K 64, 1,024 and 4,096 (the reduction length decides the blocking), a
linear with bias, LayerNorm, RMSNorm, softmax, attention (batch = requests), a row sum.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from numparity_agent._workloads._base import Built, Recorder, Workload, uniform_tensor
from numparity_agent._workloads._checks import agreement

BATCHES = (8, 64)
ROWS = max(BATCHES)
MATMUL_N = 256
MATMUL_K = (64, 1024, 4096)
WIDTH = 1024  # linear, norms, softmax
SUM_N = 1 << 16
ATTENTION = (4, 32, 16)  # heads, sequence, head dim
EPS = 1e-6


def _rms_norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)


def _matmul(x: dict[str, torch.Tensor], k: int) -> Callable[[int], torch.Tensor]:
    return lambda n: x[f"matmul_k{k}.x"][:n] @ x[f"matmul_k{k}.w"]


class Invariance(Workload):
    name = "invariance"
    version = 2  # 2: every row of each batch recorded
    compilable = False  # each op is called directly, row alone and in batches

    def build(self, *, dtype: torch.dtype, device: torch.device) -> Built:
        heads, seq, head_dim = ATTENTION
        floats: dict[str, tuple[tuple[int, ...], float]] = {
            f"matmul_k{k}.x": ((ROWS, k), 1.0) for k in MATMUL_K}
        floats |= {f"matmul_k{k}.w": ((k, MATMUL_N), k ** -0.5) for k in MATMUL_K}
        floats |= {"linear.x": ((ROWS, WIDTH), 1.0), "linear.w": ((WIDTH, WIDTH), WIDTH ** -0.5),
                   "linear.b": ((WIDTH,), WIDTH ** -0.5), "norm.x": ((ROWS, WIDTH), 1.0),
                   "softmax.x": ((ROWS, WIDTH), 4.0), "sum.x": ((ROWS, SUM_N), 1.0)}
        floats |= {f"attention.{n}": ((ROWS, heads, seq, head_dim), 1.0) for n in "qkv"}
        inputs = {name: uniform_tensor(self, f"input.{name}", shape, -bound, bound)
                  .to(dtype).to(device) for name, (shape, bound) in floats.items()}
        return Built(model=nn.Module().to(device), inputs=inputs)

    def run(self, built: Built, recorder: Recorder) -> None:
        x = built.inputs
        ops: dict[str, Callable[[int], torch.Tensor]] = {
            **{f"matmul_k{k}": _matmul(x, k) for k in MATMUL_K},
            "linear_bias": lambda n: F.linear(x["linear.x"][:n], x["linear.w"], x["linear.b"]),
            "layer_norm": lambda n: F.layer_norm(x["norm.x"][:n], (WIDTH,)),
            "rms_norm": lambda n: _rms_norm(x["norm.x"][:n]),
            "softmax": lambda n: torch.softmax(x["softmax.x"][:n], dim=-1),
            "attention": lambda n: F.scaled_dot_product_attention(
                x["attention.q"][:n], x["attention.k"][:n], x["attention.v"][:n],
                is_causal=True),
            "sum": lambda n: x["sum.x"][:n].sum(dim=-1),
        }
        found: dict[str, Any] = {}
        with torch.no_grad():
            for name, op in ops.items():
                alone = op(1)[:1]
                recorder.record(f"{name}.b1", "probe", alone)
                sizes: dict[int, dict[str, Any]] = {}
                batches: dict[int, torch.Tensor] = {}
                for batch in BATCHES:
                    batches[batch] = op(batch)
                    row = batches[batch][:1]
                    recorder.record(f"{name}.b{batch}", "probe", row)
                    sizes[batch] = agreement(row, alone)
                # Every row each call computed, not row 0 alone: a wrong value anywhere
                # in the batches differs from the peers' (issue 44: 82 % of faults
                # injected here changed nothing recorded when only row 0 was).
                whole, again = batches[ROWS], op(ROWS)
                for batch, rows in batches.items():
                    recorder.record(f"{name}.batch{batch}", "probe", rows)
                recorder.record(f"{name}.batch{ROWS}.again", "probe", again)
                ulps = [c["max_ulp"] for c in sizes.values()]
                found[name] = {
                    "batch_invariant": all(c["equal"] for c in sizes.values()),
                    "max_ulp": None if None in ulps else max(ulps),
                    "differing_sizes": [b for b, c in sizes.items() if not c["equal"]],
                    "repeatable": agreement(again, whole)["equal"],
                }
        recorder.fields["invariance"] = found
        breaking = [name for name, verdict in found.items() if not verdict["batch_invariant"]]
        ulps = [found[name]["max_ulp"] for name in breaking]
        recorder.fields["checks"] = {"batch_invariant": {
            "equal": not breaking, "op": breaking[0] if breaking else None,
            "ops": breaking, "max_ulp": None if None in ulps else max(ulps, default=0)}}
