"""Output of GET /divergence: the key, then the analysis report (design §3.3)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class DivergenceKey(BaseModel):
    suite: str
    workload: str
    workload_version: int | None
    variant: str
    tensor: str | None


class Excluded(BaseModel):
    node: str
    run_id: str
    reason: str


_METRICS = {"max_abs": 1.27e-07, "max_rel": 0.00236, "max_ulp": 19968.0,
            "mismatch_fraction": 0.0, "rmse": 2.9e-08, "cosine": 1.0, "sqnr_db": 151.2,
            "rel_l2": 2.8e-08, "rel_l2_est": 2.7e-08, "rel_l2_err": 2.4e-09}
EXAMPLE: dict[str, Any] = {
    "key": {"suite": "standard", "workload": "cnn", "workload_version": 1,
            "variant": "default", "tensor": "output"},
    "tensor": "output",
    "groups": [
        {"id": 1, "hash": "5d1c…", "size": 3, "nodes": ["lab-01", "lab-02", "lab-03"],
         "devices": [], "env_keys": ["43a0…"],
         "representative": {"node": "lab-01", "run_id": "0f1c…", "device": "cpu"},
         "fp64": {"acceptable": True, "rmse": 3.1e-08, "baseline_rmse": 3.1e-08,
                  "multiplier": 2.0, "limit": 6.2e-08}},
        {"id": 2, "hash": "9e7a…", "size": 1, "nodes": ["lab-mkl"], "devices": [],
         "env_keys": ["ee1c…"],
         "representative": {"node": "lab-mkl", "run_id": "7d3e…", "device": "cpu"},
         "fp64": {"acceptable": True, "rmse": 3.4e-08, "baseline_rmse": 3.1e-08,
                  "multiplier": 2.0, "limit": 6.2e-08}},
    ],
    "pairs": [{
        "a": 1, "b": 2, "verdict": "equivalent", "basis": "values", "metrics": _METRICS,
        "first_divergent_layer": {"name": "fc1", "order": 6, "verdict": "equivalent",
                                  "basis": "values", "metrics": _METRICS},
        "largest_jump": {"name": "fc1", "order": 6, "previous": "flatten",
                         "metric": "rel_l2", "rel_error": 3.0e-08, "ratio": 251.7},
        "attribution": [{"attribute": "env_vars.MKL_CBWR", "a": ["unset"],
                         "b": ["COMPATIBLE"]}],
        "indistinguishable": False,
        "origin": {
            "trace_a": "3c0e51a2…", "trace_b": "b81f07d4…", "ops_a": 27, "ops_b": 27,
            "same_sequence": True, "aligned": 27, "parting": None, "count": 1,
            "ops": [{"seq_a": 16, "seq_b": 16, "op": "aten.addmm.default", "module": "fc1",
                     "phase": "forward", "layer": "fc1", "tensor": "fc1",
                     "inputs": [{"dtype": "float32", "shape": [512]},
                                {"dtype": "float32", "shape": [64, 1024]},
                                {"dtype": "float32", "shape": [1024, 512]}],
                     "outputs": [{"dtype": "float32", "shape": [64, 512]}],
                     "kernel_a": None, "kernel_b": None,
                     "output": {"tensor": "fc1", "verdict": "equivalent", "basis": "values",
                                "metrics": _METRICS, "evidence": ""}}],
        },
        "origin_note": None,
    }],
    "attribution": [{"attribute": "env_vars.MKL_CBWR", "distinct_values": 2,
                     "conditional_entropy": 0.0, "purity": 1.0}],
    "members_without_tensor": [],
    "origin_note": None,
    "excluded": [],
}


class DivergenceOut(BaseModel):
    # The analysis may add fields; they pass through unchanged.
    model_config = ConfigDict(extra="allow", json_schema_extra={"examples": [EXAMPLE]})

    key: DivergenceKey
    tensor: str | None = Field(description="The tensor grouped by; null: the whole result")
    groups: list[dict[str, Any]]
    pairs: list[dict[str, Any]]
    attribution: list[dict[str, Any]]
    members_without_tensor: list[str]
    origin_note: str | None = Field(
        None, description="Set when origin ops were computed for some pairs only (more than "
                          "12 groups: the pairs with group 1). Each pair's `origin` has the "
                          "shape of /compare's, or is null with `origin_note` saying why")
    excluded: list[Excluded]
