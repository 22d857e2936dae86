"""Op traces (`run --trace-ops`, design §2.10): every aten operation of one run of a
workload, in execution order, with the hash of every tensor it read and wrote.

Two environments that compute a workload differently part at some operation: the first
whose inputs are the same bits on both and whose output is not. The server finds it by
aligning two traces (design §3.3.14); the agent records what it needs to: for each op
its overload (`aten.addmm.default`), the module path it ran under, its phase (forward,
backward, optimizer), its tensor inputs and outputs as references, a hash of its other
arguments, and what the backend chose where it chose among kernels (the convolution
backend, the SDPA backend, on CUDA the kernel names the profiler saw).

A reference is the first HASH_CHARS hex digits of the tensor's fingerprint hash
(`_fingerprint.tensor_hash`: sha256 over dtype, shape and bytes), so an op whose output
is a recorded tensor (a layer's output) points at that tensor's fingerprint, and its
values where the server has them. `tensors` maps each reference to dtype and shape.

The body holds no floats, and its hash is sha256 of its canonical JSON (sorted keys,
compact): the server computes the same to store it once, however many nodes send it.

The trace is recorded in a pass of its own after the fingerprinted repeats
(`trace_workload`), and kept only when that pass recorded the same tensors, bit for bit,
as the fingerprinted one: a trace always describes the computation whose fingerprints
it travels with.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from numparity_agent._fingerprint import tensor_hash

FORMAT = "numparity.trace/v1"
HASH_CHARS = 16
PHASES = ("forward", "backward", "optimizer")
# The attribute of an autograd node (`Node.metadata`) that names the module whose
# forward created it: the module path of the ops that run it in backward.
_MODULE_KEY = "numparity.module"
# The SDPA backend each of its aten ops is (the composite op dispatches to one of them).
_SDPA_BACKENDS = {
    "_scaled_dot_product_flash_attention": "flash",
    "_scaled_dot_product_flash_attention_for_cpu": "flash",
    "_scaled_dot_product_efficient_attention": "efficient",
    "_scaled_dot_product_cudnn_attention": "cudnn",
    "_scaled_dot_product_fused_attention_overrideable": "overrideable",
    "_scaled_dot_product_attention_math": "math",
    "_scaled_dot_product_attention_math_for_mps": "math",
}
_CONVOLUTIONS = ("convolution", "_convolution")


def trace_hash(body: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of a trace body (its `hash` left out); the server
    computes the same (design §2.7)."""
    canonical = json.dumps({k: v for k, v in body.items() if k != "hash"}, sort_keys=True,
                           separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def reference(digest: str) -> str:
    """A tensor's reference in a trace: the start of its fingerprint hash."""
    return digest[:HASH_CHARS]


class OpTracer(TorchDispatchMode):
    """Records every aten op dispatched while it is active (see the module docstring).

    `modules` names the model's modules (`named_modules`); `profile_kernels` records, on
    CUDA, the kernels each op launched (`CudaKernels`)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch >= 2.5 wraps a mode's __torch_dispatch__ in dynamo's `disable`, whose
        # first call imports torch._dynamo: 1 s of every traced child. Nothing here is
        # ever compiled.
        return False

    def __init__(self, modules: dict[nn_Module, str] | None = None) -> None:
        super().__init__()
        self.ops: list[dict[str, Any]] = []
        self.tensors: dict[str, list[Any]] = {}
        self._modules = modules or {}
        self._stack: list[str] = []
        self._scope: str | None = None
        self._paused = 0
        # id(tensor) -> (weak reference, version, reference): a tensor read again (a
        # weight, an activation) is hashed once per version, not once per read.
        self._known: dict[int, tuple[weakref.ref[torch.Tensor], int, str]] = {}
        self.on_op: Callable[[int], Any] | None = None  # CudaKernels' hook

    # ---- what the workload and the module hooks tell -------------------------------

    @contextlib.contextmanager
    def scope(self, phase: str) -> Iterator[None]:
        """Ops inside run in `phase` (a workload marks its optimizer step)."""
        previous, self._scope = self._scope, phase
        try:
            yield
        finally:
            self._scope = previous

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Ops inside are not the workload's (the recorder copying a tensor): unrecorded."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    def enter_module(self, module: Any) -> None:
        name = self._modules.get(module)
        if name is not None:
            self._stack.append(name)

    def leave_module(self, module: Any, output: Any) -> None:
        name = self._modules.get(module)
        if name is None or not self._stack:
            return
        self._stack.pop()
        _label_graph(output, name)

    # ---- the dispatch ---------------------------------------------------------------

    def _ref(self, tensor: torch.Tensor) -> str:
        try:
            version = tensor._version
        except RuntimeError:  # an inference tensor keeps no version: hash it every time
            version = None
        key = id(tensor)
        known = self._known.get(key)
        if version is not None and known is not None and known[0]() is tensor \
                and known[1] == version:
            return known[2]
        ref = reference(tensor_hash(tensor.detach()))
        if ref not in self.tensors:
            self.tensors[ref] = [str(tensor.dtype).removeprefix("torch."),
                                 [int(d) for d in tensor.shape]]
        if version is not None:
            self._known[key] = (weakref.ref(tensor), version, ref)
        return ref

    def _phase_and_module(self) -> tuple[str, str]:
        node = _current_autograd_node()
        if node is not None:
            metadata = getattr(node, "metadata", None)
            module = metadata.get(_MODULE_KEY, "") if isinstance(metadata, dict) else ""
            return "backward", module
        return self._scope or "forward", self._stack[-1] if self._stack else ""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if self._paused or getattr(func, "is_view", False):
            # A view computes nothing: its bits are its input's, rearranged. The op that
            # reads it names its bytes; the view itself cannot be where two runs part.
            return func(*args, **kwargs)
        flat, _spec = tree_flatten((args, kwargs))
        # Inputs are read before the op: an in-place op changes them.
        inputs = [self._ref(t) for t in flat if isinstance(t, torch.Tensor)]
        others = [_plain_arg(a) for a in flat if not isinstance(a, torch.Tensor)]
        seq = len(self.ops)
        if self.on_op is not None:
            with self.on_op(seq):
                out = func(*args, **kwargs)
        else:
            out = func(*args, **kwargs)
        outputs = [self._ref(t) for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        phase, module = self._phase_and_module()
        op: dict[str, Any] = {"op": str(func), "module": module, "phase": phase,
                              "in": inputs, "out": outputs}
        if others:
            op["args"] = hashlib.sha256(repr(others).encode()).hexdigest()[:HASH_CHARS]
        kernel = _kernel_choice(func, args)
        if kernel is not None:
            op["kernel"] = kernel
        self.ops.append(op)
        return out

    def body(self) -> dict[str, Any]:
        body = {"format": FORMAT, "hash_chars": HASH_CHARS, "tensors": self.tensors,
                "ops": self.ops}
        return {"hash": trace_hash(body), **body}


nn_Module = Any  # torch.nn.Module; a name for the annotation above without importing nn


def _current_autograd_node() -> Any:
    """The autograd node being run while backward runs, else None (torch >= 2.0)."""
    current = getattr(torch._C, "_current_autograd_node", None)
    return current() if current is not None else None


def _label_graph(output: Any, module: str) -> None:
    """Name `module` on every autograd node its forward created: walk back from its
    outputs' grad_fn to the nodes an earlier (inner, or preceding) module named."""
    pending: list[Any] = [t.grad_fn for t in tree_flatten(output)[0]
                          if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    seen: set[int] = set()
    while pending:
        node = pending.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        metadata = getattr(node, "metadata", None)
        if not isinstance(metadata, dict) or _MODULE_KEY in metadata:
            continue
        metadata[_MODULE_KEY] = module
        pending.extend(next_node for next_node, _index in node.next_functions)


def _plain_arg(value: Any) -> Any:
    """A non-tensor argument as it decides the op's result: a device by its type only,
    so the same op on cuda:0 and cuda:3 (or two nodes' GPUs) has the same arguments."""
    if isinstance(value, torch.device):
        return value.type
    return value


def _kernel_choice(func: Any, args: Any) -> str | None:
    """What the backend chose for this op, where it chooses among kernels and torch
    says which: the SDPA backend (by the op the composite dispatched to), the
    convolution backend (torch's own selection, e.g. Mkldnn against Slow2d)."""
    name = getattr(getattr(func, "_overloadpacket", None), "__name__", "")
    if name in _SDPA_BACKENDS:
        return f"sdpa:{_SDPA_BACKENDS[name]}"
    if name in _CONVOLUTIONS:
        return _conv_backend(args)
    return None


def _conv_backend(args: Any) -> str | None:
    select = getattr(torch._C, "_select_conv_backend", None)
    if select is None or len(args) < 9:
        return None
    try:
        (inp, weight, bias, stride, padding, dilation, transposed, output_padding,
         groups) = args[:9]
        backend = select(inp, weight, bias, stride, padding, dilation, transposed,
                         output_padding, groups, None)
    except Exception:  # noqa: BLE001 - a signature this torch does not take: unknown
        return None
    return "conv:" + str(getattr(backend, "name", backend)).removeprefix("_ConvBackend.")


class CudaKernels:
    """The CUDA kernels each traced op launched, from torch.profiler: each op runs
    inside `record_function("numparity#<seq>")` and afterwards the kernels below that
    range (correlated by the profiler) are joined into the op's `kernel`. A kernel name
    such as `…_tf32_…` or a split-K GEMM is the explanation of a difference."""

    PREFIX = "numparity#"

    def __init__(self, profiler: Any) -> None:
        self._profiler = profiler

    def around(self, seq: int) -> Any:
        return torch.profiler.record_function(f"{self.PREFIX}{seq}")

    def annotate(self, ops: list[dict[str, Any]]) -> None:
        for seq, names in self.kernels_by_op().items():
            if 0 <= seq < len(ops) and names:
                choice = ops[seq].get("kernel")
                ops[seq]["kernel"] = "; ".join(([choice] if choice else []) + names)

    def kernels_by_op(self) -> dict[int, list[str]]:
        found: dict[int, list[str]] = {}
        for event in self._profiler.events() or []:
            name = getattr(event, "name", "")
            if not name.startswith(self.PREFIX):
                continue
            try:
                seq = int(name[len(self.PREFIX):])
            except ValueError:
                continue
            found[seq] = list(dict.fromkeys(_kernel_names(event)))
        return found


def _kernel_names(event: Any) -> Iterator[str]:
    """The names of the device kernels an event and its CPU children launched."""
    for kernel in getattr(event, "kernels", None) or []:
        name = getattr(kernel, "name", None)
        if name:
            yield str(name)
    for child in getattr(event, "cpu_children", None) or []:
        if str(getattr(child, "device_type", "")).endswith("CUDA"):
            yield str(child.name)
        else:
            yield from _kernel_names(child)


@contextlib.contextmanager
def _module_hooks(tracer: OpTracer) -> Iterator[None]:
    """Global module hooks that keep the tracer's module path (torch >= 1.13)."""
    from torch.nn.modules import module as module_mod

    def pre(module: Any, _args: Any) -> None:
        tracer.enter_module(module)

    def post(module: Any, _args: Any, output: Any) -> None:
        tracer.leave_module(module, output)

    handles = [module_mod.register_module_forward_pre_hook(pre),
               module_mod.register_module_forward_hook(post)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def tracing(model: Any, device: torch.device) -> Iterator[OpTracer]:
    """An OpTracer active over the block, with the module path of `model`'s modules and,
    on CUDA, each op's kernels. The tracer's `body()` is the trace once the block ends."""
    tracer = OpTracer({module: name for name, module in model.named_modules() if name})
    with contextlib.ExitStack() as stack:
        kernels = None
        if device.type == "cuda":
            from torch.profiler import ProfilerActivity, profile

            profiler = stack.enter_context(profile(activities=[ProfilerActivity.CPU,
                                                               ProfilerActivity.CUDA]))
            kernels = CudaKernels(profiler)
            tracer.on_op = kernels.around
        stack.enter_context(_module_hooks(tracer))
        stack.enter_context(tracer)
        yield tracer
    if kernels is not None:
        kernels.annotate(tracer.ops)
