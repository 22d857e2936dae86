"""Output of GET /api/v1 and GET /api/v1/suites."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from numparity_server.kit.pagination import Page


class Resource(BaseModel):
    method: str
    path: str
    summary: str = Field(description="What it answers, in one line")


class ApiRoot(BaseModel):
    name: str
    version: str
    resources: list[Resource] = Field(description="Every operation under /api/v1, the "
                                                  "catalog (/api/v1/suites) first")
    docs: str = Field(description="Swagger UI of the OpenAPI schema")
    redoc: str
    openapi: str
    dashboard: str


class TensorSeen(BaseModel):
    name: str
    kind: str = Field(description="output, layer, grad, loss, probe … as the agent named it")


class VariantSeen(BaseModel):
    variant: str
    nodes: int = Field(description="Devices (a node's CPU, each of its GPUs) with a newest "
                                   "result of this key")
    statuses: dict[str, int] = Field(description="Those devices by their result's status "
                                                 "(ok, skipped, failed)")
    devices: list[str] = Field(description="Device types of the ok results (cpu, cuda)")
    versions: list[int] = Field(description="Workload versions of the ok results")
    divergence: str | None = Field(description="GET /divergence of this key (whole results); "
                                               "null when no result is ok")


class WorkloadSeen(BaseModel):
    suite: str
    workload: str
    versions: list[int] = Field(description="Workload versions of the ok newest results, "
                                            "oldest first")
    variants: list[VariantSeen] = Field(description="In the dashboard's order: default, "
                                                    "strict, fp64-reference, then the rest")
    tensors: list[TensorSeen] = Field(
        description="Every tensor name of the ok results' manifests, in execution order "
                    "(the newest version's first): the values /divergence's `tensor` takes")
    page: str = Field(description="The dashboard's page of this workload")


_EXAMPLE: dict[str, Any] = {
    "items": [{
        "suite": "standard", "workload": "probes", "versions": [1],
        "variants": [{"variant": "default", "nodes": 5, "statuses": {"ok": 5},
                      "devices": ["cpu"], "versions": [1],
                      "divergence": "/api/v1/divergence?suite=standard&workload=probes"
                                    "&variant=default"},
                     {"variant": "tf32", "nodes": 5, "statuses": {"skipped": 5},
                      "devices": [], "versions": [], "divergence": None}],
        "tensors": [{"name": "sum_long", "kind": "probe"},
                    {"name": "matmul_large_k", "kind": "probe"}],
        "page": "/workloads/probes?suite=standard",
    }],
    "total": 6, "limit": 1, "offset": 3, "suites": ["standard"],
}


class SuitesPage(Page[WorkloadSeen]):
    """A page of the workloads (by suite, then name) with every suite's name."""

    model_config = {"json_schema_extra": {"examples": [_EXAMPLE]}}

    suites: list[str] = Field(description="Every suite some node has a newest result in")
