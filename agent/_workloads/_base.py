"""The Workload interface and what every workload shares.

A workload builds a model and its portable inputs (design §2.1: from the agent's own
generator, on the CPU in float32, then cast and moved), and runs it, recording the
tensors to fingerprint. Leaf-module activations are recorded by forward hooks, named
by module path, in execution order; the workload records its outputs (and later its
losses and gradients) itself.
"""

from __future__ import annotations

import contextlib
import importlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from numparity_agent import _rng
from numparity_agent._workloads import SUITE

# The variant that compiles the model (`_variants.COMPILED_VARIANT`).
COMPILED = "compiled"

SEED = 0


@dataclass
class Built:
    """A model on its device and its named inputs, ready to run."""

    model: nn.Module
    inputs: dict[str, torch.Tensor]


@dataclass
class Recorder:
    """Collects (name, kind, tensor) in the order they are produced."""

    tensors: list[tuple[str, str, torch.Tensor]] = field(default_factory=list)
    # Result fields a workload adds beside its tensors (e.g. "train": {...}), JSON-ready.
    fields: dict[str, Any] = field(default_factory=dict)
    # The fault drill (design §2.6), when set: the layer hooks call it once a leaf
    # module's output is recorded, as `tensors[first:]`, with (recorder, first, output).
    # It returns the output the model goes on with (None: unchanged) and keeps the
    # recorded copies in step with it, so what is fingerprinted is what flows on.
    layer_fault: Callable[[Recorder, int, Any], Any] | None = None
    # The op tracer of a traced pass (`_trace.OpTracer`), when one runs: `phase` tells it
    # which ops are the optimizer's.
    tracer: Any = None
    _seen: dict[str, int] = field(default_factory=dict)
    # Contexts entered around a phase (`_determinism.selective`: the optimizer step made
    # deterministic), by phase name.
    phase_scopes: dict[str, Any] = field(default_factory=dict)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Ops inside run in phase `name` ("optimizer") for the op trace, if one runs."""
        with contextlib.ExitStack() as stack:
            if name in self.phase_scopes:
                stack.enter_context(self.phase_scopes[name]())
            if self.tracer is not None:
                stack.enter_context(self.tracer.scope(name))
            yield

    def record(self, name: str, kind: str, value: Any) -> None:
        """Record a tensor, or each tensor of a tuple/list as `name.i`."""
        if isinstance(value, torch.Tensor):
            count = self._seen.get(name, 0)
            self._seen[name] = count + 1
            # A module called twice in one forward: the second call is `name#1`.
            unique = name if count == 0 else f"{name}#{count}"
            with self.tracer.paused() if self.tracer is not None else contextlib.nullcontext():
                copy = value.detach().clone()
            self.tensors.append((unique, kind, copy))
        elif isinstance(value, tuple | list):
            for i, item in enumerate(value):
                self.record(f"{name}.{i}", kind, item)


def _record_layer(recorder: Recorder, name: str, module: nn.Module, output: Any) -> None:
    # Recurrent layers return (output, h_n) or (output, (h_n, c_n)): name the parts.
    if isinstance(module, nn.RNNBase) and isinstance(output, tuple) and len(output) == 2:
        out, state = output
        recorder.record(f"{name}.output", "layer", out)
        if isinstance(state, tuple) and len(state) == 2:
            recorder.record(f"{name}.h", "layer", state[0])
            recorder.record(f"{name}.c", "layer", state[1])
        else:
            recorder.record(f"{name}.h", "layer", state)
        return
    recorder.record(name, "layer", output)


def layer_tensors(output: Any) -> list[torch.Tensor]:
    """The tensors of a layer's output in the order `_record_layer` records them
    (depth first through tuples and lists, the recurrent layers' parts included)."""
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, tuple | list):
        return [t for item in output for t in layer_tensors(item)]
    return []


def replace_layer_tensor(output: Any, position: int, tensor: torch.Tensor) -> Any:
    """`output` with its tensor number `position` (in `layer_tensors` order) replaced."""
    if isinstance(output, torch.Tensor):
        return tensor if position == 0 else output
    if not isinstance(output, tuple | list):
        return output
    items = []
    for item in output:
        count = len(layer_tensors(item))
        if 0 <= position < count:
            item = replace_layer_tensor(item, position, tensor)
        items.append(item)
        position -= count
    if hasattr(output, "_make"):  # a namedtuple (PackedSequence)
        return output._make(items)
    return type(output)(items)


@contextlib.contextmanager
def layer_hooks(model: nn.Module, recorder: Recorder) -> Iterator[None]:
    """Record the output of every leaf module, named by its module path."""
    handles = []
    for name, module in model.named_modules():
        if name and not any(True for _ in module.children()):

            def hook(module: nn.Module, _args: Any, output: Any, name: str = name) -> Any:
                first = len(recorder.tensors)
                _record_layer(recorder, name, module, output)
                if recorder.layer_fault is None:
                    return None
                # The drill's own arithmetic is not the workload's: no op of the trace.
                with (recorder.tracer.paused() if recorder.tracer is not None
                      else contextlib.nullcontext()):
                    return recorder.layer_fault(recorder, first, output)

            handles.append(module.register_forward_hook(hook))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


class Workload:
    """One reference workload. Subclasses set `name`, `version` and implement build."""

    suite: str = SUITE
    name: str = ""
    version: int = 1
    # Whether `run --trace-ops` traces its ops (design §2.10): not a workload whose work
    # happens in other processes (the collectives).
    traceable: bool = True
    # The variants it runs under (None: every one); under another it is skipped, saying so.
    variants: frozenset[str] | None = None
    # The most repeats it needs (None: as many as the run asks): a workload that repeats
    # its own measurement (the data pipeline's two runs) runs once.
    max_repeats: int | None = None
    # Whether what it records comes from its model's forward, which the compiled variant
    # compiles (design §2.14); a workload that calls ops itself (the probes) has nothing
    # for torch.compile to compile, and is skipped there saying so.
    compilable: bool = True
    # Whether a child runs it once, unrecorded, before the run whose tensors it records
    # (design §2.3, "warm-up"): on a CPU, torch's first evaluation of a workload in a
    # process can differ in the last bits from every later one (measured: `train`'s
    # gradients in about 1 % of fresh processes), so an honest node's first answer
    # would read as a faulty device's. The large suite's workloads, whose one evaluation
    # costs seconds to minutes, record their first (their repeats say when it differs).
    warmup: bool = True

    def skip_reason(self, variant: str) -> str | None:
        """Why this workload does not run under `variant` (None: it does)."""
        if variant == COMPILED and not self.compilable:
            return (f"{self.name} calls its ops itself, outside a model's forward: the "
                    "compiled variant compiles a workload's model, and this one has none "
                    "to compile")
        if self.variants is None or variant in self.variants:
            return None
        return (f"{self.name} runs under {', '.join(sorted(self.variants))} only: no "
                f"setting of {variant} changes what it measures")

    def build(self, *, dtype: torch.dtype, device: torch.device) -> Built:
        raise NotImplementedError

    def run(self, built: Built, recorder: Recorder) -> None:
        """Forward the inputs through the model, recording layers and the output."""
        with torch.no_grad(), layer_hooks(built.model, recorder):
            output = built.model(*built.inputs.values())
        recorder.record("output", "output", output)


def stream_name(workload: Workload, tensor: str) -> str:
    return f"{workload.suite}/{workload.name}/v{workload.version}/{tensor}"


def bell_tensor(
    workload: Workload, tensor: str, shape: tuple[int, ...], std: float = 1.0
) -> torch.Tensor:
    """A float32 CPU tensor of bell-shaped values from the stream named `tensor`."""
    return torch.from_numpy(_rng.bell(SEED, stream_name(workload, tensor), shape, std=std))


def uniform_tensor(
    workload: Workload, tensor: str, shape: tuple[int, ...], low: float, high: float
) -> torch.Tensor:
    """A float32 CPU tensor uniform in [low, high) from the stream named `tensor`."""
    return torch.from_numpy(_rng.uniform(SEED, stream_name(workload, tensor), shape, low, high))


def class_labels(workload: Workload, tensor: str, n: int, classes: int) -> torch.Tensor:
    """n int64 labels below `classes`: floor of an exact multiple of 2**-24 times classes."""
    u = _rng.uniform(SEED, stream_name(workload, tensor), (n,), 0.0, 1.0, dtype=np.float64)
    return torch.from_numpy(np.floor(u * classes).astype(np.int64))


def autocast_dtype(device_type: str) -> torch.dtype | None:
    """The dtype autocast casts to on `device_type` right now, None when it is off."""
    try:
        enabled = torch.is_autocast_enabled(device_type)
    except TypeError:  # torch < 2.4 has no device argument
        enabled = (
            torch.is_autocast_cpu_enabled() if device_type == "cpu" else torch.is_autocast_enabled()
        )
    if not enabled:
        return None
    get_dtype = getattr(torch, "get_autocast_dtype", None)
    if get_dtype is not None:
        return get_dtype(device_type)  # type: ignore[no-any-return]
    if device_type == "cpu":
        return torch.get_autocast_cpu_dtype()
    return torch.get_autocast_gpu_dtype()


def init_default_(model: nn.Module, workload: Workload) -> None:
    """PyTorch's default init family from the portable generator.

    Linear and convolution weights and biases are uniform in +-1/sqrt(fan_in) (what
    kaiming_uniform_(a=sqrt(5)) and the bias init amount to); recurrent layers are
    uniform in +-1/sqrt(hidden_size) (what RNNBase.reset_parameters does); each
    parameter draws from its own stream named by its path. LayerNorm keeps its exact
    default (ones and zeros).
    """
    with torch.no_grad():
        for module_name, module in model.named_modules():
            if isinstance(module, nn.RNNBase):
                bound = 1.0 / math.sqrt(module.hidden_size)
                for pname, param in module.named_parameters(recurse=False):
                    values = _rng.uniform(
                        SEED,
                        stream_name(workload, f"{module_name}.{pname}"),
                        tuple(param.shape),
                        -bound,
                        bound,
                    )
                    param.copy_(torch.from_numpy(values))
                continue
            weight = getattr(module, "weight", None)
            if not isinstance(module, nn.Linear | nn.modules.conv._ConvNd):
                continue
            assert isinstance(weight, torch.Tensor)
            fan_in = math.prod(weight.shape[1:])
            bound = 1.0 / math.sqrt(fan_in)
            for pname, param in module.named_parameters(recurse=False):
                path = f"{module_name}.{pname}"
                values = _rng.uniform(
                    SEED, stream_name(workload, path), tuple(param.shape), -bound, bound
                )
                param.copy_(torch.from_numpy(values))


def place(built: Built, *, dtype: torch.dtype, device: torch.device) -> Built:
    """Cast floating tensors to `dtype` and move everything to `device` (exact)."""
    model = built.model.to(dtype=dtype).to(device)
    inputs = {
        name: (t.to(dtype) if t.is_floating_point() else t).to(device)
        for name, t in built.inputs.items()
    }
    return Built(model=model, inputs=inputs)


class FactoryWorkload(Workload):
    """A user workload from `module:factory`.

    The factory is called without arguments and returns either a Workload (used as
    is) or `(model, inputs)` with `inputs` a dict of named tensors (or a tuple),
    built on the CPU; it is then cast and moved like the built-in ones, and put in
    eval mode (dropout would make every repeat differ). It is called once per repeat,
    so repeats also check that the factory builds the same numbers each time.
    """

    def __init__(self, spec: str, factory: Any, first: Any = None) -> None:
        self.name = spec
        self.version = int(getattr(factory, "version", 1))
        self._factory = factory
        self._first = first

    def build(self, *, dtype: torch.dtype, device: torch.device) -> Built:
        made, self._first = self._first, None
        model, inputs = made if made is not None else self._factory()
        if isinstance(inputs, torch.Tensor):
            inputs = {"input0": inputs}
        elif not isinstance(inputs, dict):
            inputs = {f"input{i}": t for i, t in enumerate(inputs)}
        model.eval()
        return place(Built(model=model, inputs=dict(inputs)), dtype=dtype, device=device)


def import_factory(spec: str) -> Any:
    """The function `module:factory` names."""
    module_name, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def from_factory(spec: str) -> Workload:
    factory = import_factory(spec)
    return from_made(spec, factory, factory())


def from_made(spec: str, factory: Any, made: Any) -> Workload:
    """The workload of what `factory` returned (`made`): a Workload, or a model and its
    inputs."""
    if isinstance(made, Workload):
        made.name = made.name or spec
        return made
    return FactoryWorkload(spec, factory, first=made)
