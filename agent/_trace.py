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
(`_runner.trace_ops`), and kept only when that pass recorded the same tensors, bit for
bit, as the fingerprinted one: a trace always describes the computation whose
fingerprints it travels with.

On CUDA (design §2.10, "Cost"): a tensor's bytes are copied to pinned host memory
without waiting (`DeferredHashes`) and hashed once the pass is over, so the GPU never
idles on a host synchronisation per op; the kernel names come from one profiler
session per variant (`KernelSession`, around every traced pass of the variant, never
around a timed run), only for the ops whose kernel the backend chooses
(`KERNEL_CHOICE_OPS`), read from the profiler's raw events rather than its Python
event tree.
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import json
import os
import sys
import types
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from numparity_agent._fingerprint import tensor_hash, tensor_hashes

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
# The ops whose kernel the backend chooses among several that round differently (cuBLAS
# and cuBLASLt heuristics: split-K, TF32, reduced-precision reductions; cuDNN's
# convolution and RNN algorithms; the fused attention backends), forward and backward:
# the only ops whose CUDA kernel names a trace records. An elementwise or reduction
# kernel is the op's own and names nothing the op does not.
KERNEL_CHOICE_OPS = frozenset({
    "mm", "addmm", "bmm", "baddbmm", "addbmm", "addmv", "mv", "dot", "vdot", "matmul",
    "linear", "_addmm_activation", "_scaled_mm", "_int_mm",
    *_CONVOLUTIONS, "cudnn_convolution", "cudnn_convolution_transpose",
    "cudnn_convolution_relu", "cudnn_convolution_add_relu", "convolution_backward",
    "_convolution_double_backward", "_cudnn_rnn", "_cudnn_rnn_backward",
    *_SDPA_BACKENDS, "_flash_attention_forward", "_flash_attention_backward",
    "_efficient_attention_forward", "_efficient_attention_backward",
    "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_efficient_attention_backward",
    "_scaled_dot_product_cudnn_attention_backward",
    "_scaled_dot_product_fused_attention_overrideable_backward",
})
# Host bytes a pass keeps waiting to be hashed before it synchronises and hashes them.
PENDING_BYTES = 1 << 30
# Frames a located op's `at` skips to reach the code that called it (design §2.13): torch's
# own, the standard library's, this module's and the workload hooks'.
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_STDLIB_DIR = os.path.dirname(os.__file__) + os.sep
_OWN_FILES = frozenset({__file__, os.path.join(os.path.dirname(__file__), "_workloads",
                                               "_base.py")})
_DATA_DIR = os.path.join(_TORCH_DIR, "utils", "data") + os.sep


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

    `modules` names the model's modules (`named_modules`); `kernels` records, on CUDA,
    the kernels each op launched (`KernelSession`).

    With `locate` (the nondeterminism study's passes, design §2.13; never an uploaded
    trace) each op also says where it was called from (`at`: the first frame outside
    torch, the standard library and the agent's hooks; `via`: "DataLoader" when a
    DataLoader's code ran in between), and each view op is kept in `views` with the
    references it read and made, so a view of a computed tensor counts as computed."""

    # The devices whose tensors are hashed after the pass (`DeferredHashes`); a CPU
    # tensor is hashed at once (its bytes are already in host memory).
    DEFERRED = frozenset({"cuda"})

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch >= 2.5 wraps a mode's __torch_dispatch__ in dynamo's `disable`, whose
        # first call imports torch._dynamo: 1 s of every traced child. Nothing here is
        # ever compiled.
        return False

    def __init__(self, modules: dict[nn_Module, str] | None = None,
                 kernels: KernelSession | None = None, name: str = "",
                 locate: bool = False) -> None:
        super().__init__()
        self.ops: list[dict[str, Any]] = []
        self.views: list[dict[str, Any]] = []
        self._locate = locate
        self.tensors: dict[str, list[Any]] = {}
        self._modules = modules or {}
        self._stack: list[str] = []
        self._scope: str | None = None
        self._paused = 0
        # id(tensor) -> (weak reference, version, reference): a tensor read again (a
        # weight, an activation) is hashed once per version, not once per read.
        self._known: dict[int, tuple[weakref.ref[torch.Tensor], int, str | int]] = {}
        self._deferred = DeferredHashes()
        self._kernels = kernels
        self._name = name

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

    def _ref(self, tensor: torch.Tensor, written: bool = False) -> str | int:
        """The tensor's reference, or on a GPU the index of its pending hash. `written`:
        an output the op wrote in place (or into `out=`), hashed anew and not kept: its
        version counter is bumped only after the dispatch returns (ADInplaceOrView runs
        above the Python key), so the cached reference of its old bits would match."""
        try:
            version = None if written else tensor._version
        except RuntimeError:  # an inference tensor keeps no version: hash it every time
            version = None
        key = id(tensor)
        known = self._known.get(key)
        if version is not None and known is not None and known[0]() is tensor \
                and known[1] == version:
            return known[2]
        ref: str | int
        if tensor.device.type in self.DEFERRED:
            ref = self._deferred.add(tensor.detach())
        else:
            ref = reference(tensor_hash(tensor.detach()))
            self._describe(ref, tensor)
        if version is not None:
            self._known[key] = (weakref.ref(tensor), version, ref)
        return ref

    def _describe(self, ref: str, tensor: torch.Tensor) -> None:
        if ref not in self.tensors:
            self.tensors[ref] = [str(tensor.dtype).removeprefix("torch."),
                                 [int(d) for d in tensor.shape]]

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
        if self._paused:
            return func(*args, **kwargs)
        if getattr(func, "is_view", False):
            # A view computes nothing: its bits are its input's, rearranged. The op that
            # reads it names its bytes; the view itself cannot be where two runs part.
            out = func(*args, **kwargs)
            if self._locate:
                self._view(args, kwargs, out)
            return out
        flat, _spec = tree_flatten((args, kwargs))
        # Inputs are read before the op: an in-place op changes them.
        inputs = [self._ref(t) for t in flat if isinstance(t, torch.Tensor)]
        read = {id(t) for t in flat if isinstance(t, torch.Tensor)}
        others = [_plain_arg(a) for a in flat if not isinstance(a, torch.Tensor)]
        seq = len(self.ops)
        if self._kernels is not None and _packet_name(func) in KERNEL_CHOICE_OPS:
            with self._kernels.around(self._name, seq):
                out = func(*args, **kwargs)
        else:
            out = func(*args, **kwargs)
        outputs = [self._ref(t, written=id(t) in read) for t in tree_flatten(out)[0]
                   if isinstance(t, torch.Tensor)]
        phase, module = self._phase_and_module()
        op: dict[str, Any] = {"op": str(func), "module": module, "phase": phase,
                              "in": inputs, "out": outputs}
        if others:
            op["args"] = hashlib.sha256(repr(others).encode()).hexdigest()[:HASH_CHARS]
        kernel = _kernel_choice(func, args)
        if kernel is not None:
            op["kernel"] = kernel
        if self._locate:
            op.update(_caller())
        self.ops.append(op)
        return out

    def _view(self, args: Any, kwargs: Any, out: Any) -> None:
        """Keep a view's input and output references, before the op that comes next."""
        inputs = [self._ref(t) for t in tree_flatten((args, kwargs))[0]
                  if isinstance(t, torch.Tensor)]
        outputs = [self._ref(t) for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        self.views.append({"before": len(self.ops), "in": inputs, "out": outputs})

    def resolve(self) -> None:
        """Hash what is pending (a GPU's tensors) and put the references in the ops."""
        refs = self._deferred.resolve()
        if not refs:
            return
        for digest, dtype, shape in refs:
            if digest not in self.tensors:
                self.tensors[digest] = [dtype, shape]
        for op in [*self.ops, *self.views]:
            op["in"] = [refs[r][0] if isinstance(r, int) else r for r in op["in"]]
            op["out"] = [refs[r][0] if isinstance(r, int) else r for r in op["out"]]

    def body(self) -> dict[str, Any]:
        """The trace (`resolve` first, and the kernel names in, on a GPU); a located
        pass's has its `views` too."""
        self.resolve()
        body: dict[str, Any] = {"format": FORMAT, "hash_chars": HASH_CHARS,
                                "tensors": self.tensors, "ops": self.ops}
        if self._locate:
            body["views"] = self.views
        return {"hash": trace_hash(body), **body}


class DeferredHashes:
    """A GPU pass's tensor references, hashed when the pass is over: each tensor is
    copied, as the op reads or writes it, to pinned host memory without waiting
    (`non_blocking`, on the current stream, so the copy sees the bytes the op saw and a
    later in-place op does not change it), and the copies are hashed after one
    synchronisation. Past PENDING_BYTES the pass synchronises and hashes what it has
    (bounded host memory on a large workload)."""

    def __init__(self) -> None:
        self._pending: list[tuple[int, torch.Tensor]] = []
        self._done: list[tuple[str, str, list[int]] | None] = []
        self._bytes = 0
        self._gpu = False

    def add(self, tensor: torch.Tensor) -> int:
        on_gpu = tensor.device.type == "cuda"
        with _unfilled():
            host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=on_gpu)
        host.copy_(tensor, non_blocking=on_gpu)
        self._gpu = self._gpu or on_gpu
        index = len(self._done)
        self._done.append(None)
        self._pending.append((index, host))
        self._bytes += host.numel() * host.element_size()
        if self._bytes > PENDING_BYTES:
            self._hash_pending()
        return index

    def _hash_pending(self) -> None:
        if not self._pending:
            return
        if self._gpu:
            torch.cuda.synchronize()
        digests = tensor_hashes([host for _, host in self._pending])
        for (index, host), digest in zip(self._pending, digests, strict=True):
            self._done[index] = (reference(digest), str(host.dtype).removeprefix("torch."),
                                 [int(d) for d in host.shape])
        self._pending, self._bytes = [], 0

    def resolve(self) -> list[tuple[str, str, list[int]]]:
        """(reference, dtype, shape) of every tensor added, by index."""
        self._hash_pending()
        return [done for done in self._done if done is not None]  # every one, now


nn_Module = Any  # torch.nn.Module; a name for the annotation above without importing nn


@contextlib.contextmanager
def _unfilled() -> Iterator[None]:
    """torch.empty as it is without deterministic algorithms: under them (`strict`) it
    fills new memory with NaN first, a wasted pass over a buffer about to be copied to."""
    deterministic = getattr(torch.utils, "deterministic", None)
    fill = getattr(deterministic, "fill_uninitialized_memory", None)
    if fill is None:
        yield
        return
    deterministic.fill_uninitialized_memory = False  # type: ignore[union-attr]
    try:
        yield
    finally:
        deterministic.fill_uninitialized_memory = fill  # type: ignore[union-attr]


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
    so the same op on cuda:0 and cuda:3 (or two nodes' GPUs) has the same arguments; a
    generator by its device (its repr is its address; what it draws is in the output)."""
    if isinstance(value, torch.device):
        return value.type
    if isinstance(value, torch.Generator):
        return f"generator:{value.device.type}"
    return value


def _caller() -> dict[str, str]:
    """Where the op being dispatched was called from: {"at": "dir/file.py:line in
    function"} of the first frame outside torch, the standard library and the agent's
    hooks, and {"via": "DataLoader"} when torch.utils.data ran in between."""
    found: dict[str, str] = {}
    frame: types.FrameType | None = sys._getframe(2)
    for _ in range(200):  # bounded: a deep stack is named as unknown
        if frame is None:
            break
        path = frame.f_code.co_filename
        if path.startswith(_DATA_DIR):
            found["via"] = "DataLoader"
        if not (path.startswith(_TORCH_DIR) or path.startswith(_STDLIB_DIR)
                or path in _OWN_FILES or path.startswith("<frozen")):
            short = os.sep.join(path.split(os.sep)[-2:])
            found["at"] = f"{short}:{frame.f_lineno} in {frame.f_code.co_name}"
            break
        frame = frame.f_back
    return found


def _packet_name(func: Any) -> str:
    """`aten.addmm.default` -> `addmm`."""
    return str(getattr(getattr(func, "_overloadpacket", None), "__name__", ""))


def _kernel_choice(func: Any, args: Any) -> str | None:
    """What the backend chose for this op, where it chooses among kernels and torch
    says which: the SDPA backend (by the op the composite dispatched to), the
    convolution backend (torch's own selection, e.g. Mkldnn against Slow2d)."""
    name = _packet_name(func)
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


class KernelSession:
    """The CUDA kernels the traced ops launched, from one torch.profiler session around
    every traced pass of a variant (`record` opens it on CUDA; elsewhere it records
    nothing). Each op of KERNEL_CHOICE_OPS runs inside `record_function("numparity#<trace>#
    <seq>")`; once the session is closed, each kernel is joined to the annotation around
    the op that launched it, and `annotate` adds the names to the op's `kernel`. A
    kernel name such as `…_tf32_…` or a split-K GEMM is the explanation of a difference.

    One session, not one per workload: each profiler session initialises CUPTI, which
    instruments every loaded CUDA module (seconds on a large torch), and tears it down
    on exit (kineto's TEARDOWN_CUPTI, the default from CUDA 12.6). The events are read
    raw (`_ProfilerResult.events()`, joined by correlation id), without the Python
    event tree that `profile.events()` builds (tens of microseconds an event); any
    torch whose raw events do not read so falls back to that tree."""

    PREFIX = "numparity#"

    def __init__(self) -> None:
        self._profiler: Any = None
        self._kernels: dict[tuple[str, int], list[str]] | None = None

    @contextlib.contextmanager
    def record(self, device: torch.device) -> Iterator[KernelSession]:
        if device.type != "cuda":
            yield self
            return
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiler:
            self._profiler = profiler
            yield self
        self._kernels = None

    def around(self, trace: str, seq: int) -> Any:
        if self._profiler is None:
            return contextlib.nullcontext()
        return torch.profiler.record_function(f"{self.PREFIX}{trace}#{seq}")

    def annotate(self, trace: str, ops: list[dict[str, Any]]) -> None:
        """Add the kernels of trace `trace`'s ops to their `kernel` (after `record`)."""
        if self._profiler is None:
            return
        if self._kernels is None:
            self._kernels = self.kernels_by_op()
        for (name, seq), names in self._kernels.items():
            if name == trace and 0 <= seq < len(ops) and names:
                choice = ops[seq].get("kernel")
                ops[seq]["kernel"] = "; ".join(([choice] if choice else []) + names)

    def kernels_by_op(self) -> dict[tuple[str, int], list[str]]:
        try:
            raw = self._profiler.profiler.kineto_results.events()
            return _join_raw(raw, self.PREFIX)
        except Exception:  # noqa: BLE001 - this torch's raw events differ: the tree
            return self._from_tree()

    def _from_tree(self) -> dict[tuple[str, int], list[str]]:
        found: dict[tuple[str, int], list[str]] = {}
        for event in self._profiler.events() or []:
            key = _annotation(getattr(event, "name", ""), self.PREFIX)
            if key is not None:
                found[key] = list(dict.fromkeys(_kernel_names(event)))
        return found


def _annotation(name: str, prefix: str) -> tuple[str, int] | None:
    """("trace", seq) of an annotation named `<prefix><trace>#<seq>`, else None."""
    if not name.startswith(prefix):
        return None
    trace, _, seq = name[len(prefix):].rpartition("#")
    try:
        return trace, int(seq)
    except ValueError:
        return None


def _join_raw(events: Any, prefix: str) -> dict[tuple[str, int], list[str]]:
    """Each device event's name under the annotation around the CPU event that launched
    it (its `linked_correlation_id`), from the profiler's raw events: an op's kernels
    link to the innermost recorded op, which runs inside one annotation on its thread
    (annotations do not nest: the op inside one is the tracer's own)."""
    cpu: dict[int, tuple[int, int]] = {}  # correlation id -> (thread, start)
    spans: dict[int, list[tuple[int, int, tuple[str, int]]]] = {}  # thread -> spans
    device: list[tuple[int, str]] = []
    for event in events:
        kind = str(event.device_type())
        if kind.endswith("CPU"):
            start, end = _span_ns(event)
            thread = int(event.start_thread_id())
            cpu[int(event.correlation_id())] = (thread, start)
            key = _annotation(str(event.name()), prefix)
            if key is not None:
                spans.setdefault(thread, []).append((start, end, key))
        elif kind.endswith("CUDA"):
            device.append((int(event.linked_correlation_id()), str(event.name())))
    for thread_spans in spans.values():
        thread_spans.sort()
    starts = {thread: [span[0] for span in found] for thread, found in spans.items()}
    found: dict[tuple[str, int], list[str]] = {}
    for linked, name in device:
        launcher = cpu.get(linked)
        if launcher is None:
            continue
        thread, start = launcher
        i = bisect.bisect_right(starts.get(thread, []), start) - 1
        if i < 0:
            continue
        span_start, span_end, key = spans[thread][i]
        if span_start <= start <= span_end:
            names = found.setdefault(key, [])
            if name not in names:
                names.append(name)
    return found


def _kernel_names(event: Any) -> Iterator[str]:
    """The names of the device kernels an event of the profiler's tree and its CPU
    children launched."""
    for kernel in getattr(event, "kernels", None) or []:
        name = getattr(kernel, "name", None)
        if name:
            yield str(name)
    for child in getattr(event, "cpu_children", None) or []:
        if str(getattr(child, "device_type", "")).endswith("CUDA"):
            yield str(child.name)
        else:
            yield from _kernel_names(child)


def _span_ns(event: Any) -> tuple[int, int]:
    """(start, end) of a raw profiler event in ns (torch < 2.2 has only microseconds)."""
    if hasattr(event, "start_ns"):
        start = int(event.start_ns())
        end = int(event.end_ns()) if hasattr(event, "end_ns") else \
            start + int(event.duration_ns())
        return start, end
    start = int(event.start_us()) * 1000
    return start, start + int(event.duration_us()) * 1000


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
def tracing(model: Any, kernels: KernelSession | None = None, name: str = "",
            locate: bool = False) -> Iterator[OpTracer]:
    """An OpTracer active over the block, with the module path of `model`'s modules and,
    inside `kernels`' session (on CUDA), its annotations under the trace name `name`.
    The tracer's `body()` is the trace once the block ends (and, on CUDA, once the
    session has closed and annotated it). `locate`: see OpTracer."""
    tracer = OpTracer({module: n for n, module in model.named_modules() if n},
                      kernels=kernels, name=name, locate=locate)
    with _module_hooks(tracer), tracer:
        yield tracer
