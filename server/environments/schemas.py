"""Environments as the API lists them."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel

PROMOTED = ("gpu_name", "compute_capability", "driver", "cuda", "cudnn", "torch",
            "cpu_capability", "cpu_model")


class EnvironmentItem(BaseModel):
    env_key: str
    gpu_name: str | None
    compute_capability: str | None
    driver: str | None
    cuda: str | None
    cudnn: str | None
    torch: str | None
    cpu_capability: str | None
    cpu_model: str | None
    first_seen: datetime
    nodes: int  # nodes with at least one stored run on it
    current_nodes: int  # nodes whose newest run is on it
    runs: int
