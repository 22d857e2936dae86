"""Output of GET /audit (DESIGN §3.3): the summary, then one list per finding."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

EXAMPLE: dict[str, Any] = {
    "generated_at": "2026-11-21T10:00:00+00:00",
    "window_days": 14.0,
    "summary": {"nodes": 4, "environments": 2, "ok": 2, "suspect": 1, "watch": 0,
                "nondeterministic": 1, "stale": 0, "policy_violations": 1,
                "broken_inputs": 0},
    "inventory": {"torch": [{"value": "2.13.0+cpu", "nodes": 4}],
                  "driver": [{"value": None, "nodes": 4}]},
    "stale": [],
    "policy": [{"node": "cpu-4", "env_key": "9f2c…", "attribute": "env_vars.MKL_CBWR",
                "value": "COMPATIBLE", "rule": "allowed", "expected": ["unset"]}],
    "suspects": [{"node": "cpu-3", "status": "suspect", "env_key": "5be1…", "peers": 3,
                  "majority_nodes": 3, "disagreeing_runs": 2, "drill": True,
                  "drill_runs": 2, "currently_disagrees": True,
                  "keys": [{"suite": "standard", "workload": "cnn", "workload_version": 1,
                            "variant": "strict", "device": "cpu", "runs": 2,
                            "drill_runs": 2}],
                  "compare": {"run_a": "0f1c…", "run_b": "7d3e…", "suite": "standard",
                              "workload": "cnn", "workload_version": 1, "variant": "strict",
                              "device": "cpu"}}],
    "nondeterministic": [{"node": "cpu-2", "reason": "repeats_disagree", "suite": "standard",
                          "workload": "scatter", "workload_version": 1,
                          "variant": "default", "device": "cpu", "repeats": 2,
                          "run_id": "a41b…",
                          "detail": "the 2 repeats of scatter under default gave different "
                                    "bits"}],
    "broken_inputs": [],
    "drift": [{"node": "cpu-1", "run_id": "c9d0…", "previous_run_id": "b8e1…",
               "started_at": "2026-11-21T09:00:00+00:00", "env_key": "77aa…",
               "previous_env_key": "5be1…",
               "attributes": [{"attribute": "env_vars.MKL_CBWR", "before": "unset",
                               "after": "COMPATIBLE"}],
               "outputs_changed": [{"suite": "standard", "workload": "cnn",
                                    "variant": "default", "device": "cpu"}]}],
    "determinism_cost": [{"env_key": "5be1…", "nodes": 3, "default_s": 1.2, "strict_s": 1.5,
                          "ratio": 1.25,
                          "workloads": [{"workload": "cnn", "default_s": 0.4,
                                         "strict_s": 0.5, "ratio": 1.25}]}],
}


class AuditOut(BaseModel):
    """Every list holds plain rows; ``?format=csv&table=NAME`` gives one of them as CSV."""

    model_config = ConfigDict(extra="allow", json_schema_extra={"examples": [EXAMPLE]})

    generated_at: str
    window_days: float
    summary: dict[str, int]
    inventory: dict[str, list[dict[str, Any]]]
    stale: list[dict[str, Any]]
    policy: list[dict[str, Any]]
    suspects: list[dict[str, Any]]
    nondeterministic: list[dict[str, Any]]
    broken_inputs: list[dict[str, Any]]
    drift: list[dict[str, Any]]
    determinism_cost: list[dict[str, Any]]
