"""Output of GET /divergence: the key, then the analysis report (DESIGN §3.3)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class DivergenceKey(BaseModel):
    suite: str
    workload: str
    workload_version: int | None
    variant: str
    tensor: str


class Excluded(BaseModel):
    node: str
    run_id: str
    reason: str


class DivergenceOut(BaseModel):
    # The analysis may add fields; they pass through unchanged.
    model_config = ConfigDict(extra="allow")

    key: DivergenceKey
    tensor: str
    groups: list[dict[str, Any]]
    pairs: list[dict[str, Any]]
    attribution: list[dict[str, Any]]
    members_without_tensor: list[str]
    excluded: list[Excluded]
