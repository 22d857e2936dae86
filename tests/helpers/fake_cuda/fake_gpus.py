"""Fake GPUs at the edge of the machine, for the agent's tests (there is no GPU here).

The GPUs are described by NUMPARITY_TEST_FAKE_GPUS, a JSON list in NVML's order, e.g.

    [{"uuid": "GPU-8f3a…", "serial": "1320221012345", "name": "Fake A100", "cc": "8.0",
      "pci_bus_id": "00000000:07:00.0", "threads": 1},
     {"uuid": "MIG-5c1d…", "parent": "GPU-8f3a…", "name": "Fake A100 MIG 1g.10gb",
      "cc": "8.0"},
     {"uuid": "GPU-1b2c…", "serial": "…", "name": "Fake V100", "cc": "7.0", "crash": true}]

A MIG instance names its GPU in "parent"; a GPU with "mig_mode": true is in MIG mode.
What torch sees follows CUDA_VISIBLE_DEVICES as CUDA does: unset, every GPU (a GPU in
MIG mode: its instances instead); set, its items in order, each an index among the GPUs
or a GPU-/MIG- UUID, up to the first that matches nothing; and of all the MIG instances
that gives, only the first (CUDA enumerates one MIG instance per process).

In an agent process (sitecustomize.py, with this folder on PYTHONPATH) `install` patches
torch.cuda once torch is imported (is_available, device_count, get_device_properties:
torch's answers for those GPUs, its UUIDs without NVML's prefix) and replaces the agent's
one seam, `numparity_agent._devices.torch_device`: a fake `cuda:N` computes on the CPU,
with the GPU's "threads" as torch's thread count (a real numeric difference: ATen's long
sums split by thread count), and a GPU with "crash": true aborts the child that asks for
it; asking for the properties of one with "wedged": true never returns. pynvml.py
beside this file is NVML for the same GPUs. Tests that stay in-process call
`patch_torch` with monkeypatch.setattr.
"""

from __future__ import annotations

import importlib.abc
import json
import os
import sys
import time
from collections.abc import Callable
from types import ModuleType, SimpleNamespace
from typing import Any

ENV = "NUMPARITY_TEST_FAKE_GPUS"
MEMORY_BYTES = 85_899_345_920
SM_COUNT = 108


def gpus() -> list[dict[str, Any]]:
    """Every fake GPU and MIG instance, in NVML's order."""
    return json.loads(os.environ.get(ENV) or "[]")


def visible() -> list[dict[str, Any]]:
    """The fake devices torch sees, in torch's order (CUDA_VISIBLE_DEVICES applied)."""
    every = gpus()
    boards = [g for g in every if "parent" not in g]

    def shown_by(gpu: dict[str, Any]) -> list[dict[str, Any]]:
        # A GPU in MIG mode shows CUDA its instances, not itself.
        if gpu.get("mig_mode"):
            return [g for g in every if g.get("parent") == gpu["uuid"]]
        return [gpu]

    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    shown: list[dict[str, Any]] = []
    if listed is None:
        shown = [d for board in boards for d in shown_by(board)]
    else:
        for item in listed.split(","):
            item = item.strip()
            if item.isdigit() and int(item) < len(boards):
                shown.extend(shown_by(boards[int(item)]))
                continue
            found = [g for g in every if g["uuid"] == item]
            if not found:
                break  # CUDA ignores the rest of the list from the first bad item
            shown.extend(shown_by(found[0]))
    # CUDA enumerates a single MIG instance per process (CUDA 11/R450, 12/R525).
    first_mig = next((g for g in shown if "parent" in g), None)
    return [g for g in shown if "parent" not in g or g is first_mig]


def _board(gpu: dict[str, Any]) -> dict[str, Any]:
    if "parent" not in gpu:
        return gpu
    return next(g for g in gpus() if g["uuid"] == gpu["parent"])


def properties(index: Any) -> SimpleNamespace:
    """torch.cuda.get_device_properties of fake device `index` (int, "cuda:N", device)."""
    import torch

    position = torch.device("cuda", index) if isinstance(index, int) else torch.device(index)
    gpu = visible()[position.index or 0]
    if gpu.get("wedged"):
        time.sleep(3600)  # as CUDA asking a wedged GPU
    major, minor = (int(part) for part in gpu["cc"].split("."))
    props = SimpleNamespace(
        name=gpu["name"], major=major, minor=minor, multi_processor_count=SM_COUNT,
        total_memory=MEMORY_BYTES, uuid=gpu["uuid"].split("-", 1)[1],
    )
    bus_id = _board(gpu).get("pci_bus_id")
    if bus_id:  # newer torch has the PCI ids (the MIG instance's are its board's)
        domain, bus, rest = bus_id.split(":")
        props.pci_domain_id, props.pci_bus_id = int(domain, 16), int(bus, 16)
        props.pci_device_id = int(rest.split(".")[0], 16)
    return props


def patch_torch(torch: ModuleType, set_attr: Callable[..., None] = setattr) -> None:
    set_attr(torch.cuda, "is_available", lambda: bool(visible()))
    set_attr(torch.cuda, "device_count", lambda: len(visible()))
    set_attr(torch.cuda, "get_device_properties", properties)


def torch_device(slot: str) -> Any:
    """The fake of `numparity_agent._devices.torch_device`."""
    import torch

    device = torch.device(slot)
    if device.type != "cuda":
        return device
    gpu = visible()[device.index or 0]
    if gpu.get("crash"):
        os.abort()  # as a GPU that takes its process down
    if gpu.get("threads"):
        torch.set_num_threads(int(gpu["threads"]))
    return torch.device("cpu")


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls a hook with a module right after it is first imported."""

    def __init__(self, hooks: dict[str, Callable[[ModuleType], None]]) -> None:
        self.hooks = hooks

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        hook = self.hooks.get(name)
        if hook is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                break
        else:
            return None
        execute = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            execute(module)
            hook(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _patch_seam(module: ModuleType) -> None:
    module.torch_device = torch_device  # type: ignore[attr-defined]
    module.gpu_driver_present = lambda: True  # type: ignore[attr-defined]


def install() -> None:
    sys.meta_path.insert(0, _AfterImport({
        "torch": patch_torch,
        "numparity_agent._devices": _patch_seam,
    }))
