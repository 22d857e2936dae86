"""Which device each result of a run ran on, and what identifies it (design §3.1).

A run names its devices by slot (``cuda:3``, ``cpu``); the server keeps each device by
what follows it from node to node: its UUID (a GPU or a MIG instance), else its board
serial (unique within the run, never for MIG instances), else its slot on the node.
Documents of agents that sent no ``devices`` still say, in their environment's ``gpus``,
what sits at each CUDA index: that is read instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from numparity_server.runs.schemas import RunDocument

MODEL_CHARS = 320


@dataclass(frozen=True)
class SeenDevice:
    slot: str
    type: str
    uuid: str | None
    serial: str | None
    pci_bus_id: str | None
    name: str | None
    compute_capability: str | None
    mig: bool

    @property
    def model(self) -> str:
        """What makes two devices peers on one environment: the type, and for an
        accelerator its name and compute capability (a MIG profile is in the name)."""
        if self.type == "cpu":
            return "cpu"
        return "/".join(part for part in (self.type, self.name, self.compute_capability)
                        if part)[:MODEL_CHARS]

    def identity(self, node_id: int, *, serial_unique: bool) -> str:
        if self.uuid:
            return f"uuid:{self.uuid}"
        if self.serial and serial_unique and not self.mig and self.type != "cpu":
            return f"serial:{self.serial}"
        return f"node:{node_id}/{self.slot}"


def seen_devices(run: RunDocument) -> dict[str, SeenDevice]:
    """slot → the device, for every slot the run's results name."""
    described = {device.device: SeenDevice(
        slot=device.device, type=(device.type or _type(device.device))[:16],
        uuid=normal_uuid(device.uuid) if device.uuid else None, serial=device.serial or None,
        pci_bus_id=device.pci_bus_id, name=device.name,
        compute_capability=device.compute_capability, mig=device.mig,
    ) for device in run.devices or ()}
    gpus = _environment_gpus(run.environment.model_dump(mode="json"))
    for result in run.results:
        if result.device not in described:
            described[result.device] = _legacy(result.device, gpus)
    return described


def serials_unique(devices: dict[str, SeenDevice]) -> dict[str, bool]:
    """slot → whether its serial names no other device of the run (boards with two
    GPUs share one)."""
    counts: dict[str | None, int] = {}
    for device in devices.values():
        counts[device.serial] = counts.get(device.serial, 0) + 1
    return {slot: device.serial is not None and counts[device.serial] == 1
            for slot, device in devices.items()}


def visible_uuids(run: RunDocument) -> set[str] | None:
    """The UUIDs of every GPU the node saw in this run: NVML's list of the node's GPUs
    (``node_gpus``, whatever the run was given), its environment's ``gpus`` and its
    devices; None when neither lists them all (nothing can be concluded then). An agent
    under a scheduler's ``CUDA_VISIBLE_DEVICES=1`` sees one GPU through CUDA: without
    ``node_gpus`` (older agents, no NVML) the node's others would seem gone."""
    gpus = _environment_gpus(run.environment.model_dump(mode="json"))
    uuids = {normal_uuid(str(gpu["uuid"])) for gpu in gpus if gpu.get("uuid")}
    uuids.update(normal_uuid(device.uuid) for device in run.devices or () if device.uuid)
    if run.node_gpus:
        return uuids | {normal_uuid(uuid) for uuid in run.node_gpus}
    if any(not gpu.get("uuid") for gpu in gpus):
        return None
    return uuids


def normal_uuid(uuid: str) -> str:
    """A UUID as NVML writes it: torch's device property lacks the ``GPU-`` prefix."""
    return uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"


def _type(slot: str) -> str:
    return slot.partition(":")[0] or "unknown"


def _environment_gpus(environment: dict[str, Any]) -> list[dict[str, Any]]:
    gpus = environment.get("gpus")
    return [gpu for gpu in gpus if isinstance(gpu, dict)] if isinstance(gpus, list) else []


def _legacy(slot: str, gpus: list[dict[str, Any]]) -> SeenDevice:
    """A slot of an agent that described no devices: a CUDA index is looked up in the
    environment's ``gpus``; anything else is known by its slot only."""
    kind, _, index = slot.partition(":")
    gpu: dict[str, Any] = {}
    if kind == "cuda" and index.isdigit() and int(index) < len(gpus):
        gpu = gpus[int(index)]

    def text(key: str, limit: int) -> str | None:
        value = gpu.get(key)
        return str(value)[:limit] if value not in (None, "") else None

    uuid = text("uuid", 124)
    uuid = normal_uuid(uuid) if uuid else None
    return SeenDevice(slot=slot, type=_type(slot)[:16], uuid=uuid, serial=text("serial", 128),
                      pci_bus_id=text("pci_bus_id", 64), name=text("name", 255),
                      compute_capability=text("compute_capability", 16),
                      mig=bool(uuid and uuid.startswith("MIG-")))
