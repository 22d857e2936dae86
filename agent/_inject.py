"""A fault inside the computation (`--fault-drill op[:SPEC]`, design §2.6).

A TorchDispatchMode sees every aten op the workload dispatches, classifies it
(`op_class`) and, at the chosen call of the chosen class, flips the chosen bits of one
element of the op's output, in place, before anything reads it: the workload runs on
with the corrupted value, so whatever the following ops do to it (a ReLU that zeroes a
negative, a max-pool that does not pick it, a softmax that saturates, a rounding) is
what they would do to a fault of the hardware. Nothing is recorded apart: the recorder
copies the module outputs as always, so a fault is seen exactly when a recorded bit
changed.

A planning pass (`census`) runs the workload once, clean, and lists the class's calls
(op, output size, dtype); `resolve` turns the spec and its seed into a concrete
`Injection` (call, element, bits), the same in every repeat.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from numparity_agent._drill_spec import OpDrillSpec

# aten op names (overload packet names, a trailing "_" of an in-place op removed) by
# class. An op in none of them (views, copies, casts, indexing) is never corrupted:
# it moves bits, it does not compute them.
_CLASSES: dict[str, frozenset[str]] = {
    "matmul": frozenset({
        "mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "linear", "addmv", "mv", "dot",
        "vdot", "_addmm_activation", "_mkldnn_linear", "mkldnn_linear", "_int_mm",
        # The recurrent layers' fused kernels are matrix products at heart.
        "lstm", "gru", "rnn_tanh", "rnn_relu", "mkldnn_rnn_layer", "_cudnn_rnn",
        "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "lstm_cell", "gru_cell"}),
    "conv": frozenset({
        "convolution", "_convolution", "conv1d", "conv2d", "conv3d", "conv_transpose1d",
        "conv_transpose2d", "conv_transpose3d", "mkldnn_convolution", "cudnn_convolution",
        "cudnn_convolution_transpose", "_nnpack_spatial_convolution",
        "convolution_backward", "_slow_conv2d_forward", "slow_conv3d_forward",
        "slow_conv_transpose2d", "_conv_depthwise2d", "miopen_convolution"}),
    "attention": frozenset({
        "scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_attention_math",
        "_native_multi_head_attention", "_flash_attention_forward",
        "_efficient_attention_forward", "_scaled_dot_product_flash_attention_backward",
        "_scaled_dot_product_flash_attention_for_cpu_backward"}),
    "reduction": frozenset({
        "sum", "mean", "amax", "amin", "max", "min", "prod", "var", "std", "var_mean",
        "std_mean", "norm", "linalg_vector_norm", "_softmax", "softmax", "_log_softmax",
        "log_softmax", "logsumexp", "native_layer_norm", "native_batch_norm",
        "_native_batch_norm_legit", "_native_batch_norm_legit_no_training",
        "native_group_norm", "cumsum", "nll_loss_forward", "nll_loss", "mse_loss",
        "cross_entropy_loss", "max_pool2d_with_indices", "max_pool2d", "max_pool1d",
        "avg_pool2d", "avg_pool1d", "adaptive_avg_pool2d", "_adaptive_avg_pool2d",
        "adaptive_max_pool2d", "mkldnn_max_pool2d", "_log_softmax_backward_data",
        "_softmax_backward_data", "native_layer_norm_backward", "nll_loss_backward",
        "max_pool2d_with_indices_backward", "avg_pool2d_backward", "rms_norm",
        "_fused_rms_norm", "embedding_dense_backward"}),
    "elementwise": frozenset({
        "add", "sub", "rsub", "mul", "div", "neg", "abs", "relu", "gelu", "silu", "tanh",
        "sigmoid", "exp", "log", "pow", "sqrt", "rsqrt", "reciprocal", "clamp", "clamp_min",
        "clamp_max", "where", "addcmul", "addcdiv", "lerp", "threshold", "threshold_backward",
        "gelu_backward", "silu_backward", "tanh_backward", "sigmoid_backward", "maximum",
        "minimum", "hardtanh", "leaky_relu", "erf", "sin", "cos", "square", "mish",
        "elu", "softplus", "_foreach_add", "_foreach_mul", "_foreach_addcmul",
        "_foreach_addcdiv", "_foreach_div", "_foreach_sqrt", "_fused_adam", "_fused_adamw"}),
}
_COLLECTIVE_NAMESPACES = frozenset({"c10d", "_c10d_functional", "c10d_functional"})
_INT_OF_SIZE = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def op_class(func: Any) -> str | None:
    """The class of an aten op (`OP_CLASSES`), or None: not one a drill corrupts."""
    namespace = getattr(func, "namespace", "aten")
    if namespace in _COLLECTIVE_NAMESPACES:
        return "collective"
    if namespace != "aten":
        return None
    name = getattr(func, "_opname", "") or ""
    base = name[:-1] if name.endswith("_") and not name.startswith("_") else name
    for cls, names in _CLASSES.items():
        if name in names or base in names:
            return cls
    return None


def first_float(output: Any) -> torch.Tensor | None:
    """The op's main result: its first floating-point output tensor (of a tuple, list)."""
    if isinstance(output, torch.Tensor):
        ok = output.is_floating_point() and output.element_size() in _INT_OF_SIZE
        return output if ok and output.numel() > 0 else None
    if isinstance(output, tuple | list):
        for item in output:
            found = first_float(item)
            if found is not None:
                return found
    return None


def bit_layout(dtype: torch.dtype) -> tuple[int, int]:
    """(bits of the word, bits of the mantissa) of a floating dtype."""
    info = torch.finfo(dtype)
    return info.bits, round(-torch.log2(torch.tensor(info.eps, dtype=torch.float64)).item())


def field_bits(dtype: torch.dtype, field_name: str) -> list[int]:
    """The bit positions (0: the lowest) of a field of `dtype`'s words."""
    word, mantissa = bit_layout(dtype)
    return {"sign": [word - 1], "exponent": list(range(mantissa, word - 1)),
            "mantissa": list(range(mantissa)), "any": list(range(word))}[field_name]


def field_of(dtype: torch.dtype, bit: int) -> str:
    word, mantissa = bit_layout(dtype)
    return "sign" if bit == word - 1 else "exponent" if bit >= mantissa else "mantissa"


@dataclass(frozen=True)
class Call:
    """One call of an op of the drilled class, as the planning pass saw it."""

    op: str
    numel: int
    dtype: torch.dtype


@dataclass(frozen=True)
class Injection:
    """A resolved op drill: which call of the class, which element, which bits."""

    spec: OpDrillSpec
    call: int
    element: int
    bits: tuple[int, ...]
    calls: int


def resolve(spec: OpDrillSpec, calls: list[Call]) -> Injection | None:
    """The concrete injection `spec` names among the class's `calls` (None: the workload
    ran no op of the class). The seed draws, in this order, the call, the element and the
    bits that the spec does not name."""
    if not calls:
        return None
    draw = random.Random(spec.seed)
    call = spec.call % len(calls) if spec.call is not None else draw.randrange(len(calls))
    target = calls[call]
    element = (spec.element if spec.element is not None else draw.randrange(target.numel)) \
        % target.numel
    word, _mantissa = bit_layout(target.dtype)
    if spec.bit is not None:
        bits = tuple(b for b in range(spec.bit, spec.bit + spec.bits) if b < word)
        if not bits:
            raise ValueError(f"bit {spec.bit} is past the {word}-bit word of {target.dtype}")
    else:
        pool = field_bits(target.dtype, spec.field)
        if spec.bits > len(pool):
            raise ValueError(f"bits={spec.bits}: the {spec.field} field of {target.dtype} "
                             f"has {len(pool)}")
        bits = tuple(sorted(draw.sample(pool, spec.bits)))
    return Injection(spec, call, element, bits, len(calls))


def _signed_mask(bits: tuple[int, ...], word: int) -> int:
    mask = sum(1 << b for b in bits)
    return mask - (1 << word) if mask >= 1 << (word - 1) else mask


class OpDrill(TorchDispatchMode):
    """Counts the ops of `spec.op_class` as they are dispatched; with an `injection`,
    corrupts its call (and, stuck, every later one), else lists the calls (`census`)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # As `_trace.OpTracer`: nothing here is compiled; skip dynamo's import.
        return False

    def __init__(self, spec: OpDrillSpec, injection: Injection | None = None) -> None:
        super().__init__()
        self.spec = spec
        self.injection = injection
        self.calls: list[Call] = []
        # The result's `drill` field once a bit is flipped.
        self.flipped: dict[str, Any] | None = None
        self.hits = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        output = func(*args, **(kwargs or {}))
        if op_class(func) != self.spec.op_class:
            return output
        tensor = first_float(output)
        if tensor is None:
            return output
        call = len(self.calls)
        self.calls.append(Call(str(func), tensor.numel(), tensor.dtype))
        injection = self.injection
        if injection is None or call < injection.call:
            return output
        if call > injection.call and not injection.spec.stuck:
            return output
        self._corrupt(tensor, func, call, injection)
        return output

    def _corrupt(self, tensor: torch.Tensor, func: Any, call: int,
                 injection: Injection) -> None:
        word, _ = bit_layout(tensor.dtype)
        if max(injection.bits) >= word:
            return  # a stuck lane reaching an op of a narrower dtype: its bits are not there
        element = injection.element % tensor.numel()
        coords = tuple(int(c) for c in torch.unravel_index(torch.tensor(element),
                                                            tuple(tensor.shape)))
        words = tensor.view(_INT_OF_SIZE[tensor.element_size()])
        before = float(tensor[coords].item())
        words[coords] = words[coords] ^ _signed_mask(injection.bits, word)
        self.hits += 1
        if self.flipped is None:
            self.flipped = {
                "kind": "op", "spec": injection.spec.text(), "class": injection.spec.op_class,
                "op": str(func), "call": call, "calls": injection.calls, "index": element,
                "bits": list(injection.bits),
                "field": sorted({field_of(tensor.dtype, b) for b in injection.bits}),
                "before": before, "after": float(tensor[coords].item()),
                "stuck": injection.spec.stuck,
            }
        if self.flipped is not None:
            self.flipped["hits"] = self.hits


@contextlib.contextmanager
def injecting(drill: OpDrill | None) -> Iterator[None]:
    """`drill` active over the block (nothing when None)."""
    if drill is None:
        yield
        return
    with drill:
        yield

