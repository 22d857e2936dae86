"""The devices a run measures (design §2.6): every visible CUDA device, else the CPU.

A device is what the run document's `devices` lists (design §2.7): its slot (`cuda:3`,
the name its results carry), torch's index (after CUDA_VISIBLE_DEVICES: a MIG instance
named there is a device of its own), the UUID as NVML spells it (`GPU-…`, `MIG-…`), the
board serial and PCI bus id from NVML (nvidia-ml-py, optional), the name and the compute
capability. What cannot be read is null, never guessed.

`visible_devices` imports torch and asks CUDA and NVML, which can hang on a wedged GPU:
the agent runs it in a child process, `python -m numparity_agent._devices`, which prints
the list as JSON. The rest of this module does not import torch.

`torch_device` and `gpu_driver_present` are the seams of the test edge: the tests' fake
GPUs (tests/helpers/fake_cuda) replace them so that a fake `cuda:N` exists and computes
on the CPU.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from collections.abc import Sequence
from typing import Any

from numparity_agent._environment import anonymous_devices, without_identity

ALL = "all"
CPU = "cpu"
_CUDA_SLOT = re.compile(r"cuda:(\d+)")
# CUDA names a MIG instance after its GPU and profile: "NVIDIA A100-SXM4-40GB MIG 1g.5gb".
_MIG_NAME = re.compile(r"\sMIG\s")


class DeviceError(ValueError):
    """A device selection that is malformed or names a device this node does not show."""


def parse_selection(text: str) -> list[str]:
    """The slots and `all` of a selection ("cuda:0,cuda:3", "cpu", "all"), in order,
    each once; DeviceError naming the first item that is none of them."""
    items: list[str] = []
    for item in text.replace(",", " ").split():
        match = _CUDA_SLOT.fullmatch(item)
        slot = f"cuda:{int(match.group(1))}" if match else item
        if slot not in (ALL, CPU) and match is None:
            raise DeviceError(f"unknown device {item!r}: use cpu, cuda:N, {ALL}, or a "
                              "comma-separated list of them")
        if slot not in items:
            items.append(slot)
    if not items:
        raise DeviceError("no device named")
    return items


# What a GPU driver torch.cuda can use leaves on Linux: NVIDIA's device files (also in
# containers, which get them mounted), WSL2's GPU device, AMD's ROCm (torch.cuda on HIP).
_DRIVER_PATHS = ("/dev/nvidiactl", "/proc/driver/nvidia", "/dev/dxg", "/dev/kfd")


def gpu_driver_present() -> bool:
    """Whether torch.cuda could find a GPU here. On Linux without any GPU driver's files
    `all` is the CPU, and no child is started to ask CUDA (1.5 s of every run on a CPU
    node); elsewhere only CUDA can tell."""
    if not sys.platform.startswith("linux"):
        return True
    return any(os.path.exists(path) for path in _DRIVER_PATHS)


def needs_cuda(selection: Sequence[str]) -> bool:
    """Whether resolving `selection` needs the list of visible CUDA devices."""
    return any(item != CPU for item in selection)


def select(selection: Sequence[str], visible: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The devices `selection` names, in its order: `all` is every visible CUDA device
    (the CPU where there is none), `cpu` the CPU. DeviceError naming the visible ones
    when an item is not among them."""
    cuda = [d for d in visible if d["type"] == "cuda"]
    chosen: list[dict[str, Any]] = []
    for item in selection:
        if item == ALL:
            found = cuda or [cpu_device()]
        elif item == CPU:
            found = [cpu_device()]
        else:
            found = [d for d in cuda if d["device"] == item]
            if not found:
                names = ", ".join([d["device"] for d in cuda] + [CPU])
                raise DeviceError(f"no device {item} on this node; visible: {names}")
        for device in found:
            if all(c["device"] != device["device"] for c in chosen):
                chosen.append(device)
    return chosen


def describe(device: dict[str, Any]) -> str:
    """`cuda:1 (NVIDIA A100-SXM4-80GB, GPU-8f3c…)` for log lines."""
    what = ", ".join(str(v) for v in (device.get("name"), device.get("uuid")) if v)
    return f"{device['device']} ({what})" if what else device["device"]


def _entry(slot: str, type_: str, index: int | None) -> dict[str, Any]:
    return {"device": slot, "type": type_, "index": index, "uuid": None, "serial": None,
            "pci_bus_id": None, "name": None, "compute_capability": None, "mig": False}


def cpu_device() -> dict[str, Any]:
    """The CPU as a device: its name is the CPU model of the environment (`cpu.model`)."""
    from numparity_agent._environment import _read_cpuinfo

    device = _entry(CPU, CPU, None)
    device["name"], _flags = _read_cpuinfo({})
    return device


def visible_devices() -> list[dict[str, Any]]:
    """Every CUDA device this process sees (CUDA_VISIBLE_DEVICES applies, as torch
    applies it), enriched from NVML when pynvml imports; the CPU alone when there is
    none. Needs torch."""
    import torch

    try:
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - a driver that fails here shows no device
        count = 0
    if count == 0:
        return [cpu_device()]
    devices, torch_uuids = [], []
    for index in range(count):
        device = _entry(f"cuda:{index}", "cuda", index)
        torch_uuid = None
        try:
            props = torch.cuda.get_device_properties(index)
        except Exception:  # noqa: BLE001 - listed all the same, its fields unknown
            pass
        else:
            device["name"] = props.name
            device["compute_capability"] = f"{props.major}.{props.minor}"
            device["mig"] = bool(_MIG_NAME.search(props.name))
            torch_uuid = _torch_uuid(props)
            device["uuid"] = _nvml_spelling(torch_uuid, mig=device["mig"])
            device["pci_bus_id"] = _torch_pci_bus_id(props)
        devices.append(device)
        torch_uuids.append(torch_uuid)
    devices.extend(_enrich_from_nvml(devices, torch_uuids))
    return without_identity(devices)


def _torch_uuid(props: Any) -> str | None:
    uuid = getattr(props, "uuid", None)  # torch >= 2.1; a _CUuuid whose str is the UUID
    return str(uuid) if uuid is not None and str(uuid) else None


def _nvml_spelling(uuid: str | None, *, mig: bool) -> str | None:
    """torch's UUID as NVML (and nvidia-smi, and CUDA_VISIBLE_DEVICES) spell it."""
    if uuid is None or uuid.startswith(("GPU-", "MIG-")):
        return uuid
    return f"{'MIG' if mig else 'GPU'}-{uuid}"


def _torch_pci_bus_id(props: Any) -> str | None:
    """NVML's `domain:bus:device.function` from torch's PCI ids (newer torch). torch has
    no function number; a GPU's compute function is function 0."""
    ids = [getattr(props, name, None) for name in ("pci_domain_id", "pci_bus_id",
                                                   "pci_device_id")]
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        return None
    domain, bus, dev = ids
    return f"{domain:08X}:{bus:02X}:{dev:02X}.0"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _enrich_from_nvml(devices: list[dict[str, Any]], torch_uuids: list[str | None]
                      ) -> list[dict[str, Any]]:
    """UUID, MIG flag, serial and PCI bus id from NVML, found by torch's UUID. NVML's own
    index is not torch's (CUDA orders the fastest GPU first unless CUDA_DEVICE_ORDER is
    PCI_BUS_ID, and CUDA_VISIBLE_DEVICES hides and reorders), so a device without a
    UUID keeps what torch said. Returns the MIG instances CUDA does not show this
    process (`_mig_instances_cuda_hides`), as devices after torch's."""
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - optional dependency, or no driver: fields stay null
        return []
    try:
        for device, torch_uuid in zip(devices, torch_uuids, strict=True):
            if torch_uuid is not None:
                _from_nvml(pynvml, device, torch_uuid)
        return _mig_instances_cuda_hides(pynvml, devices, os.environ)
    except Exception:  # noqa: BLE001 - bindings without MIG: torch's devices only
        return []
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001, S110 - shutting down is best effort
            pass


def _from_nvml(pynvml: Any, device: dict[str, Any], torch_uuid: str) -> None:
    # torch's UUID has no prefix: a MIG instance is found under "MIG-", a GPU under "GPU-".
    handle = None
    for candidate in dict.fromkeys([_nvml_spelling(torch_uuid, mig=device["mig"]),
                                    _nvml_spelling(torch_uuid, mig=not device["mig"])]):
        try:
            handle = pynvml.nvmlDeviceGetHandleByUUID(candidate)
            break
        except Exception:  # noqa: BLE001, S112 - not under this spelling
            continue
    if handle is None:
        return
    try:
        device["uuid"] = _text(pynvml.nvmlDeviceGetUUID(handle))
    except Exception:  # noqa: BLE001, S110 - keep torch's UUID, spelled as NVML would
        pass
    board = handle
    try:
        device["mig"] = bool(pynvml.nvmlDeviceIsMigDeviceHandle(handle))
        if device["mig"]:
            # Serial and PCI address belong to the board the instance is carved from.
            board = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)
    except Exception:  # noqa: BLE001 - bindings without MIG: the name decided it
        board = None if device["mig"] else handle
    if board is None:
        return
    try:
        device["serial"] = _text(pynvml.nvmlDeviceGetSerial(board))
    except Exception:  # noqa: BLE001, S110 - consumer GPUs have no serial
        pass
    try:
        device["pci_bus_id"] = _text(pynvml.nvmlDeviceGetPciInfo(board).busId)
    except Exception:  # noqa: BLE001, S110 - keep what torch said
        pass


def _mig_instances_cuda_hides(pynvml: Any, devices: list[dict[str, Any]],
                              environ: Any) -> list[dict[str, Any]]:
    """The MIG instances this process may use that CUDA does not show it, as devices
    `cuda:N` after torch's (N counting on from them), in NVML's order. CUDA enumerates a
    single MIG instance per process (CUDA 11 with R450, CUDA 12 with R525: NVIDIA's MIG
    user guide), so `all` finds the others in NVML; each runs in children that see it
    alone (`_suite.isolated_visible`: CUDA_VISIBLE_DEVICES=MIG-…), where it is cuda:0.

    Which instances this process may use: with CUDA_VISIBLE_DEVICES unset, every one of
    every GPU in MIG mode; set (a scheduler's allocation), the `MIG-` UUIDs it lists, and
    every instance of a GPU it names by `GPU-` UUID or by an index CUDA resolved to one
    of that GPU's instances."""
    listed = environ.get("CUDA_VISIBLE_DEVICES")
    items = [item.strip() for item in (listed or "").split(",") if item.strip()]
    boards: list[Any] = []
    named: list[Any] = []
    if listed is None:
        boards = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    else:
        for item in items:
            with contextlib.suppress(Exception):
                (named if item.startswith("MIG-") else boards).append(
                    pynvml.nvmlDeviceGetHandleByUUID(item))
        for device in devices:  # an index CUDA resolved to a MIG-mode GPU's instance
            if device["mig"] and device["uuid"] and device["uuid"] not in items:
                with contextlib.suppress(Exception):
                    boards.append(pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
                        pynvml.nvmlDeviceGetHandleByUUID(device["uuid"])))
    instances = [handle for board in boards for handle in _mig_handles(pynvml, board)]
    seen = {d["uuid"] for d in devices if d.get("uuid")}
    hidden: list[dict[str, Any]] = []
    for handle in [*instances, *named]:
        uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
        if uuid in seen:
            continue
        seen.add(uuid)
        device = _entry(f"cuda:{len(devices) + len(hidden)}", "cuda", None)
        device["uuid"], device["mig"] = uuid, True
        with contextlib.suppress(Exception):
            device["name"] = _text(pynvml.nvmlDeviceGetName(handle))
        board = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)
        with contextlib.suppress(Exception):
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(board)
            device["compute_capability"] = f"{major}.{minor}"
        with contextlib.suppress(Exception):
            device["serial"] = _text(pynvml.nvmlDeviceGetSerial(board))
        with contextlib.suppress(Exception):
            device["pci_bus_id"] = _text(pynvml.nvmlDeviceGetPciInfo(board).busId)
        hidden.append(device)
    return hidden


def _mig_handles(pynvml: Any, board: Any) -> list[Any]:
    """NVML's handles of the MIG instances of `board` ([] when it is not in MIG mode)."""
    try:
        current, _pending = pynvml.nvmlDeviceGetMigMode(board)
        count = int(pynvml.nvmlDeviceGetMaxMigDeviceCount(board)) if current else 0
    except Exception:  # noqa: BLE001 - not MIG-capable (or a MIG handle)
        return []
    handles = []
    for index in range(count):
        try:  # the indices of a GPU's instances have gaps: NVML says Not Found
            handles.append(pynvml.nvmlDeviceGetMigDeviceHandleByIndex(board, index))
        except Exception:  # noqa: BLE001, S112
            continue
    return handles


def node_gpus() -> list[str] | None:
    """NVML's UUIDs of every GPU of the node and of every MIG instance of a GPU in MIG
    mode, whatever CUDA_VISIBLE_DEVICES shows this process: the run document's
    `node_gpus`, by which the server knows that a GPU a scheduler did not give this run
    has not left the node. None without NVML, or when the node reports its devices
    anonymously. Needs no torch."""
    if anonymous_devices():
        return None
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - optional dependency, or no driver
        return None
    try:
        uuids = []
        for index in range(int(pynvml.nvmlDeviceGetCount())):
            board = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuids.append(_text(pynvml.nvmlDeviceGetUUID(board)))
            uuids += [_text(pynvml.nvmlDeviceGetUUID(h)) for h in _mig_handles(pynvml, board)]
        return uuids
    except Exception:  # noqa: BLE001 - a partial list would detach the rest
        return None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def torch_device(slot: str) -> Any:
    """The torch.device a child computes on for `slot` ("cpu", "cuda:1").

    The test edge: tests/helpers/fake_cuda replaces this one function so that a fake
    GPU computes on the CPU (with its own thread count, or crashing on demand). Nothing
    else in the agent knows of fakes."""
    import torch

    return torch.device(slot)


def main() -> int:
    """Print the visible devices as JSON (`--node-gpus`: `node_gpus()` instead)."""
    if sys.argv[1:] == ["--node-gpus"]:
        json.dump(node_gpus(), sys.stdout)
        sys.stdout.write("\n")
        return 0
    json.dump(visible_devices(), sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
