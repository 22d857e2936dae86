"""Tensors of a GPU that is not there, in this process: `on_gpu(tensor, "cuda:2")` says
it is on cuda:2 (its `.device`, what the agent reads to decide what to synchronise) and
keeps its values on the CPU, where every op on it computes; results stay "on" the same
device, and a copy to the CPU is a plain CPU tensor. `FakeCudaRuntime` is the runtime's
edge: it records each `torch.cuda.synchronize(device)`, makes CUDA's lazy initialisation
a no-op, and (as a dispatch mode) lets pinned host memory be plain memory.

Only for code that reads tensors' devices and calls the runtime: a whole workload on a
fake GPU needs CUDA's generators and modules too, which this does not fake.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map


class OnGPU(torch.Tensor):
    inner: torch.Tensor

    @staticmethod
    def __new__(cls, inner: torch.Tensor, device: torch.device) -> OnGPU:
        wrapper = torch.Tensor._make_wrapper_subclass(
            cls, inner.shape, dtype=inner.dtype, device=device, strides=inner.stride())
        wrapper.inner = inner
        return wrapper

    def __repr__(self) -> str:  # type: ignore[override]
        return f"OnGPU({self.inner!r}, {self.device})"

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None
                           ) -> Any:
        return _on_cpu(func, args, kwargs or {})


def on_gpu(tensor: torch.Tensor, device: str | torch.device) -> OnGPU:
    return OnGPU(tensor, torch.device(device))


def _on_cpu(func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    asked = kwargs.get("device")
    to_cpu = asked is not None and torch.device(asked).type != "cuda"
    devices: list[torch.device] = []

    def unwrap(x: Any) -> Any:
        if isinstance(x, OnGPU):
            devices.append(x.device)
            return x.inner
        if isinstance(x, torch.device) and x.type == "cuda":
            devices.append(x)
            return torch.device("cpu")
        return x

    args, kwargs = tree_map(unwrap, args), tree_map(unwrap, kwargs)
    if kwargs.get("pin_memory"):
        kwargs["pin_memory"] = False  # a CPU build has no pinned allocator
    out = func(*args, **kwargs)
    if not devices or to_cpu:
        return out
    return tree_map(lambda x: OnGPU(x, devices[0]) if type(x) is torch.Tensor else x, out)


class FakeCudaRuntime(TorchDispatchMode):
    """`with FakeCudaRuntime(monkeypatch) as cuda:` ... `cuda.synchronized`: the devices
    torch.cuda.synchronize was called with, in order (None: called without one)."""

    def __init__(self, monkeypatch: Any) -> None:
        super().__init__()
        self.synchronized: list[torch.device | None] = []
        monkeypatch.setattr(torch.cuda, "synchronize", self._synchronize)
        monkeypatch.setattr(torch.cuda, "_lazy_init", lambda: None)

    def _synchronize(self, device: Any = None) -> None:
        self.synchronized.append(None if device is None else torch.device(device))

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None
                           ) -> Any:
        return _on_cpu(func, args, kwargs or {})
