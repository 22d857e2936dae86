"""Output of GET /runs/{run_id}/compiled: each compiled result against the same run's
eager answer (design §3.3.18)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

Verdict = Literal["identical", "equivalent", "divergent", "nonfinite"]


class Fp64Closeness(BaseModel):
    """Which of the two answers is closer to the float64 one (the fp64 judge's RMSE,
    design §3.3.8), on the result's output tensor."""

    tensor: str = Field(description="The output tensor judged")
    compiled_rmse: float | None
    eager_rmse: float | None
    compiled_acceptable: bool | None = Field(
        description="The fp64 judge's verdict on the compiled answer")
    eager_acceptable: bool | None
    closer: Literal["compiled", "eager", "equal"] | None = Field(
        description="compiled: the compiler's answer is the more accurate one; eager: the "
                    "compiler moved away from float64; equal: the same RMSE")


class CompiledVerdict(BaseModel):
    suite: str
    workload: str
    workload_version: int | None
    device: str
    status: str = Field(description="The compiled result's status (skipped: torch could not "
                                    "compile the workload, with torch's reason)")
    reason: str | None = None
    eager_variant: str = Field(description="The variant whose answer is eager's (default)")
    eager_status: str | None = Field(description="That result's status; null: the run has "
                                                 "none on this device")
    verdict: Verdict | None = Field(
        description="The result verdict (design §3.3.5) of compiled against eager under the "
                    "policy's tolerances; null when either is not ok or it is pending")
    decided_by: str | None = Field(description="The tensor that decided the verdict")
    output_verdict: Verdict | None = None
    verdicts: dict[str, int] = Field(default_factory=dict,
                                     description="Tensors per verdict")
    max_abs: float | None = Field(None, description="The largest max abs over the tensors")
    max_rel: float | None = None
    max_ulp: float | None = None
    first_divergent_layer: str | None = Field(
        None, description="The first recorded layer, in execution order, whose compiled "
                          "output is not eager's bits")
    fp64: Fp64Closeness | None = None
    pending: bool = False
    note: str | None = None


class CompiledOut(BaseModel):
    run_id: str
    node: str
    env_key: str
    items: list[CompiledVerdict]
    pending: int = Field(description="Comparisons the request's computing time left for the "
                                     "next ask")
