"""The sizes of the parametrised workloads, the FLOPs each computes and, for the large
suite, what a run costs an A100 (design §2.2). No torch here: `numparity-agent suites`
lists them from the parent process.

FLOPs count the matrix products (matmul, convolution, attention) at 2 per
multiply-add, as torch.utils.flop_counter does (a test holds the formulas to it), and
an attention as dense: the causal mask saves a kernel up to half of it, the math
backend nothing. Element-wise work (norms, activations, softmax, the optimizer) is left
out; at these shapes it is a few percent.

The A100 estimate divides by the dense peak of the variant's arithmetic (19.5 TFLOP/s
fp32, 156 TF32, 312 bf16/fp16) at EFFICIENCY of it, a conservative share for cuBLAS and
cuDNN at these shapes (large GEMMs reach 70-80 %). It is the GPU's compute alone:
building the inputs and fingerprinting run on the host (`bench/large_suite.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

A100_PEAK_TFLOPS = {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0}
# The arithmetic each variant's matrix products run in on an A100. `default` counts as
# fp32 (torch's default matmul precision), though cuDNN convolutions default to TF32.
VARIANT_ARITHMETIC = {"default": "fp32", "strict": "fp32", "tf32": "tf32",
                      "fp16-autocast": "fp16", "bf16-autocast": "bf16"}
EFFICIENCY = 0.5
# The SDPA passes `attention` makes on an A100: the default path, then each backend
# (math, flash, efficient, cuDNN) alone; a CPU has math and flash only.
A100_SDPA_BACKENDS = 4


@dataclass(frozen=True)
class GEMMSize:
    """C = A @ B with A (m, k), B (k, n), and the square product of their first k_square
    columns and rows."""

    m: int = 4096
    k: int = 8192
    n: int = 4096
    k_square: int = 4096

    def flops(self) -> int:
        return 2 * self.m * self.n * (self.k + self.k_square)

    def describe(self) -> str:
        return (f"{self.m}x{self.k_square} @ {self.k_square}x{self.n} and "
                f"{self.m}x{self.k} @ {self.k}x{self.n}")


@dataclass(frozen=True)
class BottleneckSize:
    """A ResNet-50 bottleneck (1x1, 3x3, 1x1 convolutions) on batch x channels x spatial^2."""

    batch: int = 8
    channels: int = 256
    width: int = 64
    spatial: int = 56

    def flops(self) -> int:
        c, w = self.channels, self.width
        return 2 * self.batch * self.spatial**2 * (c * w + 9 * w * w + w * c)

    def describe(self) -> str:
        return (f"bottleneck {self.channels}-{self.width}-{self.width}-{self.channels}, "
                f"batch {self.batch} of {self.channels}x{self.spatial}x{self.spatial}")


@dataclass(frozen=True)
class AttentionSize:
    batch: int = 2
    heads: int = 8
    seq: int = 2048
    head_dim: int = 128

    def flops(self, backends: int = A100_SDPA_BACKENDS) -> int:
        """The default path and `backends` more SDPA passes (QK^T and PV, dense)."""
        one = 4 * self.batch * self.heads * self.seq**2 * self.head_dim
        return (1 + backends) * one

    def describe(self) -> str:
        return (f"causal SDPA, batch {self.batch}, {self.heads} heads, seq {self.seq}, "
                f"head dim {self.head_dim}; and each backend alone")


@dataclass(frozen=True)
class DecoderSize:
    """The decoder's dimensions (`decoder.SIZE` is the standard suite's)."""

    vocab: int
    d_model: int
    heads: int
    layers: int
    hidden: int
    seq: int
    request_lengths: tuple[int, ...]

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads

    def _forward(self, tokens: int, keys: int) -> int:
        """One forward of `tokens` tokens, each attending to `keys` keys (dense)."""
        d, layers = self.d_model, self.layers
        linear = 2 * tokens * (layers * (4 * d * d + 3 * d * self.hidden) + d * self.vocab)
        return linear + layers * 4 * tokens * keys * d

    def flops(self, backends: int = A100_SDPA_BACKENDS) -> int:
        """Prefill, decode with a KV cache, the requests alone and in one padded batch,
        and layer 0's attention through `backends` SDPA backends."""
        seq, lengths = self.seq, self.request_lengths
        prefill = self._forward(seq, seq)
        decode = sum(self._forward(1, t) for t in range(1, seq + 1))
        longest = max(lengths)
        batched = (sum(self._forward(n, n) for n in lengths)
                   + len(lengths) * self._forward(longest, longest))
        return prefill + decode + batched + backends * 4 * seq * seq * self.d_model

    def describe(self) -> str:
        return (f"decoder d {self.d_model}, {self.layers} layers, {self.heads} heads, "
                f"SwiGLU {self.hidden}, vocab {self.vocab}; prefill {self.seq}, decode, "
                f"requests {', '.join(map(str, self.request_lengths))}")


@dataclass(frozen=True)
class TrainSize:
    batch: int = 256
    features: tuple[int, int, int] = (1024, 2048, 1000)
    steps: int = 20

    def flops(self) -> int:
        """Per step: forward 2B(dh + hc); backward fc2's weight and input gradients
        (4Bhc) and fc1's weight gradient (2Bdh; the input needs none)."""
        d, h, c = self.features
        return self.steps * (4 * self.batch * d * h + 6 * self.batch * h * c)

    def describe(self) -> str:
        d, h, c = self.features
        return f"{self.steps} Adam steps of an MLP {d}-{h}-{c}, batch {self.batch}"


# The large suite at full size (tests build the same workloads smaller).
LARGE_GEMM = GEMMSize()
LARGE_BOTTLENECK = BottleneckSize()
LARGE_ATTENTION = AttentionSize()
LARGE_DECODER = DecoderSize(vocab=4096, d_model=1024, heads=8, layers=8, hidden=2816,
                            seq=128, request_lengths=(37, 64, 101, 128))
LARGE_TRAIN = TrainSize()
LARGE: dict[str, GEMMSize | BottleneckSize | AttentionSize | DecoderSize | TrainSize] = {
    "gemm": LARGE_GEMM, "resnet_block": LARGE_BOTTLENECK, "attention": LARGE_ATTENTION,
    "decoder": LARGE_DECODER, "train": LARGE_TRAIN,
}


def a100_seconds(flops: int, variant: str) -> float:
    return flops / (A100_PEAK_TFLOPS[VARIANT_ARITHMETIC[variant]] * 1e12 * EFFICIENCY)


def suites_listing(repeats: int = 2) -> str:
    """`numparity-agent suites`: each suite's workloads; for `large` each one's shape,
    GFLOP per run and A100 seconds per run in fp32, TF32 and 16-bit, and the GPU compute
    of a whole run (every default variant, `repeats` runs each)."""
    from numparity_agent import _workloads

    lines = [f"{_workloads.SUITE} (the default): "
             f"{', '.join(_workloads.builtin_names(_workloads.SUITE))}",
             "",
             f"{_workloads.LARGE} (--suite {_workloads.LARGE}; production shapes for GPU "
             "nodes; fp64-reference only when named):",
             f"  {'workload':<13} {'GFLOP':>7} {'A100 ms fp32/tf32/16-bit':>25}  shape"]
    total = 0.0
    for name, size in LARGE.items():
        flops = size.flops()
        times = [a100_seconds(flops, v) for v in ("default", "tf32", "bf16-autocast")]
        total += repeats * sum(a100_seconds(flops, v) for v in VARIANT_ARITHMETIC)
        lines.append(f"  {name:<13} {flops / 1e9:>7.1f} "
                     f"{' / '.join(f'{t * 1e3:.1f}' for t in times):>25}  {size.describe()}")
    lines.append(f"  a run's GPU compute ({len(VARIANT_ARITHMETIC)} variants x {repeats} repeats) "
                 f"at {EFFICIENCY:.0%} of an A100's dense peak: {total:.1f} s; the host's "
                 "share (inputs, fingerprints) dominates: bench/large_suite.py")
    return "\n".join(lines) + "\n"
