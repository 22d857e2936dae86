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

**Other processes.** A dispatch mode sees its own process only, and a forked child
inherits a copy of it whose counts never come back. A workload whose ops run in
processes it starts (`collectives`' ranks, `data`'s DataLoader workers) opens a `Site`
(`remote_site`) per group of processes it starts: each member (rank, worker) gets a
picklable `RemoteDrill` (the spec, and the injection when the chosen call is that
member's), installs its own `OpDrill` with `member_drill` (modes inherited from a forked
parent dropped first) and sends back a `RemoteReport` (its calls by class, what it
flipped); the site splices the members' calls, in member order, into the parent's list
at the site's place, so a call number names one call of one process, the same in the
planning pass and in every repeat. A stuck lane stays in the process of its first call
(one device's broken unit).
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import (
    TorchDispatchMode,
    _disable_current_modes,
    _len_torch_dispatch_stack,
    _pop_mode,
)

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
    # A call of another process (`Site`): the n-th site of the run, the member (rank,
    # worker) and the call's index among that member's calls of the class.
    site: int | None = None
    member: int | None = None
    local: int | None = None


@dataclass(frozen=True)
class Injection:
    """A resolved op drill: which call of the class, which element, which bits (and,
    for a call of another process, its site, member and index there)."""

    spec: OpDrillSpec
    call: int
    element: int
    bits: tuple[int, ...]
    calls: int
    site: int | None = None
    member: int | None = None
    local: int | None = None


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
    return Injection(spec, call, element, bits, len(calls), target.site, target.member,
                     target.local)


def _signed_mask(bits: tuple[int, ...], word: int) -> int:
    mask = sum(1 << b for b in bits)
    return mask - (1 << word) if mask >= 1 << (word - 1) else mask


class OpDrill(TorchDispatchMode):
    """Lists the ops of every class as they are dispatched (`census`; `calls`: those of
    `spec.op_class`); with an `injection`, corrupts its call of `spec.op_class` (and,
    stuck, every later one of this process)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # As `_trace.OpTracer`: nothing here is compiled; skip dynamo's import.
        return False

    def __init__(self, spec: OpDrillSpec, injection: Injection | None = None) -> None:
        super().__init__()
        self.spec = spec
        self.injection = injection
        self.census: dict[str, list[Call]] = defaultdict(list)
        # The result's `drill` field once a bit is flipped.
        self.flipped: dict[str, Any] | None = None
        self.hits = 0
        self.sites = 0  # the `Site`s opened so far
        # Collectives' flips still to make (`settle`): (output tensor, op, call).
        self.pending: list[tuple[torch.Tensor, Any, int]] = []

    @property
    def calls(self) -> list[Call]:
        return self.census[self.spec.op_class]

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        output = func(*args, **(kwargs or {}))
        cls = op_class(func)
        if cls is None:
            return output
        tensor = first_float(output)
        if tensor is None:
            return output
        calls = self.census[cls]
        call = len(calls)
        calls.append(Call(str(func), tensor.numel(), tensor.dtype))
        injection = self.injection
        if cls != self.spec.op_class or injection is None or injection.site is not None:
            return output  # another class, a census, or a call of another process
        if call < injection.call or (call > injection.call and not injection.spec.stuck):
            return output
        if cls == "collective":
            # A collective returns its output with the Work that fills it: gloo's thread
            # or NCCL's stream is still writing, and gloo's reduce-scatter copies its
            # share into the output only in the caller's wait(). The flip waits for the
            # caller to have the collective's answer (`settle`).
            self.pending.append((tensor, func, call))
            return output
        self._corrupt(tensor, func, call, injection)
        return output

    def settle(self) -> None:
        """The collectives' flips, now that their answers are in their outputs."""
        pending, self.pending = self.pending, []
        for tensor, func, call in pending:
            assert self.injection is not None
            self._corrupt(tensor, func, call, self.injection)

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


# The drills active in this process, innermost last (`injecting`): where a `Site` finds
# the drill its processes take part in.
_ACTIVE: list[OpDrill] = []


@contextlib.contextmanager
def injecting(drill: OpDrill | None) -> Iterator[None]:
    """`drill` active over the block (nothing when None)."""
    if drill is None:
        yield
        return
    _ACTIVE.append(drill)
    try:
        with drill:
            yield
        drill.settle()
    finally:
        _ACTIVE.remove(drill)


def settle() -> None:
    """A synchronous collective has returned (its caller waited for it): the active
    drill's flip of its output, if it is the chosen call, happens now. Code that runs
    collectives calls it after each (`collectives`); a flip not settled by then is made
    when the drill ends."""
    if _ACTIVE:
        _ACTIVE[-1].settle()


# ---- ops in other processes -----------------------------------------------------------


@dataclass(frozen=True)
class RemoteDrill:
    """What one member process of a `Site` takes of the run's drill (picklable, for a
    forkserver or spawn start): the spec, and the injection when the chosen call is
    this member's (`call`: its index among the member's own calls of the class)."""

    spec: OpDrillSpec
    injection: Injection | None = None


@dataclass(frozen=True)
class RemoteReport:
    """What a member process sends back: its calls by class, what it flipped."""

    census: dict[str, list[Call]]
    flipped: dict[str, Any] | None
    hits: int


class Site:
    """A group of processes a workload starts under the run's drill (its ranks, one
    epoch's DataLoader workers), `kind` naming a member ("rank", "worker")."""

    def __init__(self, drill: OpDrill, index: int, kind: str) -> None:
        self.drill, self.index, self.kind = drill, index, kind

    def member(self, number: int) -> RemoteDrill:
        """What member `number` installs (`member_drill`)."""
        injection = self.drill.injection
        if injection is None or (injection.site, injection.member) != (self.index, number):
            return RemoteDrill(self.drill.spec)
        assert injection.local is not None
        local = dataclasses.replace(injection, call=injection.local, site=None, member=None,
                                    local=None)
        return RemoteDrill(self.drill.spec, local)

    def absorb(self, reports: list[RemoteReport | None]) -> None:
        """The members' reports, in member order (None: a member that ran no drill),
        spliced into the parent's drill: calls numbered after the parent's so far, the
        flip (with its member and its call's number in the run) as the drill's own."""
        drill = self.drill
        for number, report in enumerate(reports):
            if report is None:
                continue
            offset = len(drill.calls)
            for cls, calls in report.census.items():
                drill.census[cls].extend(
                    dataclasses.replace(call, site=self.index, member=number, local=local)
                    for local, call in enumerate(calls))
            if report.flipped is not None and drill.flipped is None:
                drill.flipped = {**report.flipped, "call": offset + report.flipped["call"],
                                 self.kind: number,
                                 f"{self.kind}_call": report.flipped["call"]}
            drill.hits += report.hits
        if drill.flipped is not None:
            drill.flipped["hits"] = drill.hits


def remote_site(kind: str) -> Site | None:
    """The next site of the drill active here (None: no drill). Call it once per group
    of processes started, in the workload's order (the planning pass and every repeat
    must open the same sites)."""
    if not _ACTIVE:
        return None
    drill = _ACTIVE[-1]
    drill.sites += 1
    return Site(drill, drill.sites - 1, kind)


class MemberDrill:
    """A member process's drill (`member_drill`): `report()` once its work is done."""

    def __init__(self, drill: OpDrill | None) -> None:
        self.drill = drill

    def report(self) -> RemoteReport | None:
        if self.drill is None:
            return None
        return RemoteReport(dict(self.drill.census), self.drill.flipped, self.drill.hits)


@contextlib.contextmanager
def member_drill(remote: RemoteDrill | None) -> Iterator[MemberDrill]:
    """In a member process: the dispatch modes a forked member inherits from its parent
    dropped (their counts would never come back, and an inherited injection would fire
    at the parent's numbering), and `remote`'s drill installed over the block."""
    with _disable_current_modes():
        inherited = list(_ACTIVE)
        _ACTIVE.clear()
        try:
            drill = OpDrill(remote.spec, remote.injection) if remote is not None else None
            with injecting(drill):
                yield MemberDrill(drill)
        finally:
            _ACTIVE[:] = inherited



# A member process whose work has no block to wrap (a DataLoader worker: its loop is the
# DataLoader's): its drill, and where its report goes (`begin_member`).
_MEMBER: list[tuple[OpDrill, Callable[[RemoteReport], None]]] = []


def begin_member(remote: RemoteDrill, deliver: Callable[[RemoteReport], None]) -> None:
    """In a member process that runs until it exits: the dispatch modes inherited from a
    forked parent dropped for good (the parent's frames that entered them never resume
    here) and `remote`'s drill installed for the rest of the process; `member_report`
    hands its report to `deliver`."""
    while _len_torch_dispatch_stack() > 0:
        _pop_mode()
    drill = OpDrill(remote.spec, remote.injection)
    drill.__enter__()
    _ACTIVE[:] = [drill]
    _MEMBER[:] = [(drill, deliver)]


def member_report() -> None:
    """A member started by `begin_member` has finished a piece of work (a batch): its
    flips settled and its report so far delivered (nothing elsewhere)."""
    if _MEMBER:
        drill, deliver = _MEMBER[0]
        drill.settle()
        deliver(RemoteReport(dict(drill.census), drill.flipped, drill.hits))
