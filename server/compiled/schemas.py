"""Output of GET /runs/{run_id}/compiled: each compiled result against the same run's
eager answer (design §3.3.18)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from numparity_server.reads.explanations import ExplanationOut

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


class CompilePass(BaseModel):
    seconds: float = Field(description="The compile and one run")
    cache_hits: int = Field(description="Graphs served by Inductor's (or AOTAutograd's) "
                                        "cache")
    cache_misses: int = Field(description="Graphs Inductor had to generate")
    graphs: int = Field(description="Graphs dynamo made")


class CompileRecord(BaseModel):
    """How the node compiled the workload (design §2.14): a pass per repeat."""

    backend: str | None = None
    mode: str | None = None
    passes: list[CompilePass] = Field(description="The first 16 passes, in order")
    pass_count: int = Field(description="Passes the node recorded")
    cold_s: float | None = Field(description="The first cold pass's seconds (it missed "
                                             "Inductor's cache); null: none was cold")
    warm_s: float | None = Field(description="The first warm pass's seconds (every graph "
                                             "from the cache); null: none was warm")


class Localisation(BaseModel):
    """Where, inside the compiled graph, the result parts from eager (design §2.14):
    the first leaf module whose compiled output differs when compiled alone, with the
    kernels Inductor generated for it; or none, the difference coming from fusion
    across modules."""

    where: Literal["identical", "module", "fusion across modules", "not localised"] = Field(
        description="identical: the node's own check found eager's bits; module: "
                    "`module` differs compiled alone; fusion across modules: every leaf "
                    "module gives eager's bits alone; not localised: see `note`/`error`")
    module: str | None = None
    kernels: list[str] = Field(default_factory=list)
    first_differing: str | None = Field(None, description="The first recorded tensor the "
                                                          "node found differing")
    differing: int | None = None
    leaves_tried: int | None = None
    seconds: float | None = None
    note: str | None = None
    error: str | None = None


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
    compile: CompileRecord | None = Field(None, description="The node's compile passes")
    localisation: Localisation | None = Field(
        None, description="Where the node found the compiled result parting from eager")
    restores_eager: ExplanationOut | None = Field(
        None, description="The newest `explain --target eager` finding against this run "
                          "for this result: the Inductor setting under which the node's "
                          "compiled answer is eager's bits (`label`), or that none is")
    pending: bool = False
    note: str | None = None


class CompiledOut(BaseModel):
    run_id: str
    node: str
    env_key: str
    items: list[CompiledVerdict]
    pending: int = Field(description="Comparisons the request's computing time left for the "
                                     "next ask")
