"""Nodes and their timelines, as the API returns them."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from numparity_server.kit.pagination import Page


class NodeItem(BaseModel):
    name: str
    labels: dict[str, Any]
    first_seen: datetime
    last_seen: datetime  # when its newest upload was received
    last_run_at: datetime | None  # started_at of its newest run
    env_key: str | None  # environment of its newest run
    runs: int


class ResultChange(BaseModel):
    """A result whose manifest (or status) differs from the same key in the previous run."""

    suite: str
    workload: str
    variant: str
    device: str
    status: str
    previous_status: str
    manifest_hash: str | None
    previous_manifest_hash: str | None
    # Whether the tensors of kind "output" changed (null when either side has no manifest).
    outputs_changed: bool | None


class AttributeChange(BaseModel):
    attribute: str  # a flattened environment attribute, as attribution names it
    before: str
    after: str


class TimelineRun(BaseModel):
    run_id: str
    started_at: datetime
    received_at: datetime
    agent_version: str | None
    drill: bool
    env_key: str
    # Compared with the node's previous run (by started_at); null for its first run.
    previous_run_id: str | None
    environment_changed: bool | None
    # What changed in the environment since the previous run (drift: with
    # changed_results, the attribute that came with a change of answers).
    environment_changes: list[AttributeChange] = []
    changed_results: list[ResultChange]


class DeviceItem(BaseModel):
    """A device that sits on the node now (its newest run used it or saw it)."""

    device: str = Field(description="Its slot on the node: cuda:3, cpu")
    type: str
    model: str = Field(description="cpu, or type/name/compute capability: devices of one "
                                   "model on one environment are peers in the audit")
    uuid: str | None = Field(description="GPU or MIG UUID, which follows the device from "
                                         "node to node")
    serial: str | None
    pci_bus_id: str | None
    name: str | None
    compute_capability: str | None
    mig: bool
    first_seen: datetime
    last_seen: datetime


class DeviceTelemetryItem(BaseModel):
    """A GPU's NVML readings in the node's newest run that has any (issue 44): what a
    suspect's disagreements are read beside (SDCs grow with temperature)."""

    device: str = Field(description="Its slot in that run")
    uuid: str | None
    run_id: str
    started_at: datetime
    start: dict[str, bool | int | float] | None = Field(description="At the run's start")
    end: dict[str, bool | int | float] | None = Field(description="At the run's end")


class NodeTimeline(BaseModel):
    name: str
    labels: dict[str, Any]
    first_seen: datetime
    last_seen: datetime
    devices: list[DeviceItem]
    telemetry: list[DeviceTelemetryItem] = Field(
        default_factory=list, description="The GPUs' NVML readings (temperature, clocks, "
        "power, ECC and remapped rows) at the start and end of the node's newest run "
        "that recorded any")
    runs: Page[TimelineRun]
