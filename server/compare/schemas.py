"""Output of GET /compare: two runs, result by result and tensor by tensor (design §3.3).

Run a is the reference ("expected"), run b the candidate: metrics measure b against a.
A verdict is what ``torch.testing.assert_close(actual=b, expected=a, equal_nan=True)``
says under the policy's tolerances: NaN against NaN counts as equal (the convention),
an infinity only matches the same infinity.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from numparity_server.reads.explanations import ExplanationOut

Semantics = Literal["cpu", "cuda"]
SEMANTICS_DESCRIPTION = ("Whose torch.isclose arithmetic judged closeness: cuda (both results "
                         "computed on one and the same CUDA device) or cpu (two devices' "
                         "results are compared as assert_close compares them, on the CPU)")


class RunInfo(BaseModel):
    run_id: str
    node: str
    env_key: str
    agent_version: str | None
    started_at: datetime
    drill: bool = Field(description="A fault drill (`run --fault-drill`): one bit flipped on "
                                    "purpose, to check the analysis catches it")


class EnvironmentDifference(BaseModel):
    attribute: str = Field(description="Dotted path in the flattened environment")
    a: str = Field(description='Value in run a ("unset" where absent)')
    b: str = Field(description='Value in run b ("unset" where absent)')
    a_short: str = Field(description="a as a person compares it: a long or multi-line value "
                                     "cut to the (first line) part that differs from b")
    b_short: str = Field(description="b likewise")


class ResultKey(BaseModel):
    suite: str
    workload: str
    variant: str
    device: str


class ResultSide(BaseModel):
    """What one run's result of the key says, tensors aside."""

    status: str
    workload_version: int | None
    reason: str | None = None
    error: str | None = None
    manifest_hash: str | None = None
    repeats_agree: bool | None = None


class Inputs(BaseModel):
    """Whether both results ran on the same input and parameter bytes (design §2.1)."""

    input_hash_equal: bool | None = Field(description="None when a side has no input_hash")
    param_hash_equal: bool | None = Field(description="None when a side has no param_hash")
    broken: bool = Field(description="A hash differs: broken inputs, not a divergence")


class TensorComparison(BaseModel):
    name: str
    kind: str
    order: int = Field(description="Position in run a's manifest")
    dtype: str | None
    verdict: str = Field(description="identical (same bits), equivalent (assert_close with "
                                     "equal_nan=True passes), divergent (it fails on finite "
                                     "values) or nonfinite (a NaN or Inf without its match)")
    basis: str = Field(description="The evidence that decided: hash, values, sample, sketch, "
                                   "stats")
    metrics: dict[str, float | None] = Field(
        description="Measured over the whole tensor (basis values or hash) or null: "
                    "never a sample's figure. rel_l2_est ± rel_l2_err is the sketch's "
                    "estimate of the relative L2 error")
    evidence: str = Field("", description="What a verdict not made from the whole values "
                                          "rests on, in words (the sample's maxima as lower "
                                          "bounds, the sketch's estimate)")
    semantics: Semantics = Field("cpu", description=SEMANTICS_DESCRIPTION)


class OutputVerdict(BaseModel):
    name: str
    verdict: str


class ResultVerdictOut(BaseModel):
    verdict: str = Field(description="The worst verdict of all the tensors compared")
    tensor: str = Field(description="The tensor that decided it: the first, in run a's "
                                    "execution order, of the most severe")
    kind: str


class PairSummary(BaseModel):
    tensors: int = Field(description="Tensors compared (present in both results)")
    verdicts: dict[str, int] = Field(description="Number of tensors per verdict")
    result_verdict: ResultVerdictOut | None = Field(
        description="The verdict of the whole result over every tensor compared (outputs, "
                    "layers, gradients, losses, probes): what torch.testing.assert_close over "
                    "all of them would say. None when no tensor is in both results")
    outputs: list[OutputVerdict] = Field(description="The tensors of kind output with their "
                                                     "verdicts: the first 50")
    outputs_total: int = Field(0, description="Tensors of kind output")
    output_verdict: str | None = Field(
        description="The worst verdict of the tensors of kind output; None for a workload "
                    "without one (train, probes): read result_verdict")


class BitFlip(BaseModel):
    index: int = Field(description="Flat index of the one element that differs")
    bit: int = Field(description="The one bit that differs, from the least significant "
                                 "bit of the tensor's dtype")
    reference: float = Field(description="The element in run a")
    candidate: float = Field(description="The element in run b")


class FirstDivergentLayer(BaseModel):
    name: str
    order: int
    verdict: str
    basis: str
    metrics: dict[str, float | None]
    bit_flip: BitFlip | None = Field(
        None, description="Set when both whole values are stored and they differ in one "
                          "element by one bit: a flipped bit (a fault drill's, or a "
                          "corrupting device's), not a rounding difference")


class LargestJump(BaseModel):
    name: str
    order: int
    previous: str | None
    metric: str
    rel_error: float
    ratio: float | None = Field(description="rel_error over the previous layer's (at least "
                                            "one rounding of the dtype)")


class FirstNonfinite(BaseModel):
    name: str
    kind: str
    order: int
    nan: int = Field(description="NaN count in run b")
    inf: int = Field(description="Inf count in run b")
    reference_nan: int = Field(description="NaN count in run a")
    reference_inf: int = Field(description="Inf count in run a")


class TensorSpecOut(BaseModel):
    dtype: str
    shape: list[int]


class OriginOutput(BaseModel):
    """An origin op's output compared, where it is a recorded tensor on both sides."""

    tensor: str = Field(description="The recorded tensor the output is (run a's name)")
    verdict: str
    basis: str
    metrics: dict[str, float | None]
    evidence: str = ""


class OriginOp(BaseModel):
    """An op both runs ran on bit-identical inputs (the same input hashes and other
    arguments) whose outputs differ: an independent source of difference."""

    seq_a: int = Field(description="Its position in run a's trace")
    seq_b: int = Field(description="Its position in run b's trace")
    op: str = Field(description="The aten overload: aten.addmm.default")
    module: str = Field(description='The module path it ran under ("" outside any)')
    phase: str = Field(description="forward, backward or optimizer")
    layer: str = Field(description="The recorded tensor its output is, else its module path")
    tensor: str | None = Field(description="The recorded tensor its output is, if any")
    inputs: list[TensorSpecOut]
    outputs: list[TensorSpecOut]
    kernel_a: str | None = Field(description="What run a's backend chose, when recorded")
    kernel_b: str | None = Field(description="What run b's backend chose, when recorded")
    output: OriginOutput | None = Field(
        description="b's output against a's, when both are recorded tensors")


class PartingPoint(BaseModel):
    """The first position where the two op sequences differ, both ops named (null past
    the end of a trace)."""

    seq_a: int
    seq_b: int
    a: str | None
    module_a: str | None
    phase_a: str | None
    kernel_a: str | None
    b: str | None
    module_b: str | None
    phase_b: str | None
    kernel_b: str | None


class OriginOut(BaseModel):
    """Where two results' op traces part and which ops made the difference (design
    §3.3.14)."""

    trace_a: str
    trace_b: str
    ops_a: int = Field(description="Ops in run a's trace")
    ops_b: int = Field(description="Ops in run b's trace")
    same_sequence: bool = Field(description="Both traces ran the same op sequence")
    aligned: int = Field(description="Pairs of ops the alignment made")
    aligned_up_to: int | None = Field(
        None, description="Null when every op was aligned. Else the alignment's work "
                          "budget ran out: the ops of run a's trace from this position on "
                          "were not aligned, and no origin op was looked for among them")
    parting: PartingPoint | None = Field(description="Where the sequences part; null when "
                                                     "they are the same")
    count: int = Field(description="Origin ops in all")
    ops: list[OriginOp] = Field(description="The first 20 origin ops in execution order: "
                                            "the first is where the difference starts")


class ToleranceOut(BaseModel):
    rtol: float
    atol: float


class NondeterministicOpOut(BaseModel):
    """An op an agent found giving other bits on the same inputs (design §2.13)."""

    op: str
    module: str
    phase: str
    recipe: str | None = Field(None, description="How to make it alone deterministic "
                                                 "(null: no_recipe says why not)")
    no_recipe: str | None = None


class ResultPair(ResultKey):
    """One key both runs have. Tensors only when both results are ok."""

    a: ResultSide
    b: ResultSide
    compared: bool = Field(description="Both results are ok: their tensors were compared")
    semantics: Semantics | None = Field(
        None, description="Whose torch.isclose arithmetic judged the tensors: cuda when "
                          "both results were computed on CUDA devices (float16 and bfloat16 "
                          "pairs at the boundary may differ from the CPU's), else cpu; null "
                          "when nothing was compared")
    inputs: Inputs
    notes: list[str] = Field(default_factory=list)
    summary: PairSummary | None = None
    first_divergent_layer: FirstDivergentLayer | None = None
    largest_jump: LargestJump | None = None
    first_nonfinite: FirstNonfinite | None = None
    tolerances: dict[str, ToleranceOut] = Field(
        default_factory=dict, description="The policy's tolerance per dtype of the tensors")
    tensors_only_in_a: list[str] = Field(default_factory=list,
                                         description="Tensors of a's result only: the first 50")
    tensors_only_in_a_total: int = 0
    tensors_only_in_b: list[str] = Field(default_factory=list,
                                         description="Tensors of b's result only: the first 50")
    tensors_only_in_b_total: int = 0
    tensors_total: int = Field(0, description="Tensors compared (in both results): the "
                                              "summary covers them all")
    tensors: list[TensorComparison] = Field(
        default_factory=list, description="This pair's tensors on the page (`limit` rows "
                                          "from `offset`, counted over the pairs in order)")
    pending: bool = Field(False, description="Its summary or its origin ops are not "
                                             "computed yet (the note says which): ask again")
    origin: OriginOut | None = Field(
        None, description="The ops where the two results' numbers part, from their op "
                          "traces (both ok and traced)")
    origin_note: str | None = Field(
        None, description="Why there is no origin for two ok results: a side has no op "
                          "trace")
    nondeterministic: bool = Field(
        False, description="A side's repeats disagree, or one environment gave both "
                           "answers: the difference is nondeterminism, not the environment "
                           "(design §3.3.16)")
    nondeterministic_ops: list[NondeterministicOpOut] = Field(
        default_factory=list, description="The ops the agents' traced repeats named (the "
                                          "first first)")
    nondeterminism_note: str | None = None
    explanations: list[ExplanationOut] = Field(
        default_factory=list,
        description="What `numparity-agent explain` found between the two runs' nodes for "
                    "this result: the setting under which one gives the other's bits "
                    "(newest per direction)")


class CompareOut(BaseModel):
    run_a: RunInfo
    run_b: RunInfo
    workload: str | None = Field(description="The workload filter, if any")
    variant: str | None = Field(description="The variant filter, if any")
    environment: list[EnvironmentDifference] = Field(
        description="Attributes whose values differ (empty when the env_key is the same): "
                    "the first 500, each value cut at 4,096 characters")
    environment_total: int = Field(0, description="Attributes whose values differ")
    pairs: list[ResultPair] = Field(description="Every result both runs have, with its "
                                                "summary; the tensor rows of the page only")
    limit: int = Field(description="Tensor rows per page")
    offset: int = Field(description="Tensor rows skipped, counted over the pairs in order")
    tensors_total: int = Field(description="Tensor rows of every pair")
    pending: int = Field(0, description="Summaries and origin ops not computed yet: this "
                                        "request's computing time (NUMPARITY_COMPUTE_SECONDS)"
                                        " ran out before them; ask again and the answer "
                                        "goes on where it stopped")
    only_in_a: list[ResultKey]
    only_in_b: list[ResultKey]


def _metrics(max_abs: float, max_rel: float, max_ulp: float, mismatch: float, rmse: float,
             cosine: float, sqnr_db: float, rel_l2: float) -> dict[str, float | None]:
    return {"max_abs": max_abs, "max_rel": max_rel, "max_ulp": max_ulp,
            "mismatch_fraction": mismatch, "rmse": rmse, "cosine": cosine,
            "sqnr_db": sqnr_db, "rel_l2": rel_l2, "rel_l2_est": None, "rel_l2_err": None}


_CONV2 = _metrics(0.001, 6.25, 1944293990.0, 1.0, 0.001, 0.9999995, 60.1, 0.000988)
_SKIPPED = {"status": "skipped", "workload_version": None,
            "reason": "TF32 needs an NVIDIA GPU of compute capability 8.0 or newer",
            "error": None, "manifest_hash": None, "repeats_agree": None}

# GET /compare?run_a=r-16&run_b=r-17: run b on MKL_CBWR=COMPATIBLE parts from conv2 on.
COMPARE_EXAMPLE: dict[str, Any] = {
    "run_a": {"run_id": "r-16", "node": "gpu-node-03", "env_key": "af244ce5…",
              "agent_version": "0.1.0", "started_at": "2026-11-21T10:00:00Z", "drill": False},
    "run_b": {"run_id": "r-17", "node": "gpu-node-17", "env_key": "4aab5a60…",
              "agent_version": "0.1.0", "started_at": "2026-11-21T10:05:00Z", "drill": False},
    "workload": None,
    "variant": None,
    "environment": [{"attribute": "env_vars.MKL_CBWR", "a": "unset", "b": "COMPATIBLE",
                     "a_short": "unset", "b_short": "COMPATIBLE"}],
    "environment_total": 1,
    "limit": 50, "offset": 0, "tensors_total": 4, "pending": 0,
    "pairs": [
        {
            "suite": "standard", "workload": "cnn", "variant": "default", "device": "cpu",
            "a": {"status": "ok", "workload_version": 1, "reason": None, "error": None,
                  "manifest_hash": "0684c83c…", "repeats_agree": True},
            "b": {"status": "ok", "workload_version": 1, "reason": None, "error": None,
                  "manifest_hash": "67741a9e…", "repeats_agree": True},
            "compared": True,
            "inputs": {"input_hash_equal": True, "param_hash_equal": True, "broken": False},
            "notes": [],
            "summary": {"tensors": 4,
                        "verdicts": {"identical": 1, "equivalent": 0, "divergent": 3,
                                     "nonfinite": 0},
                        "result_verdict": {"verdict": "divergent", "tensor": "conv2",
                                           "kind": "layer"},
                        "outputs": [{"name": "output", "verdict": "divergent"}],
                        "outputs_total": 1, "output_verdict": "divergent"},
            "first_divergent_layer": {"name": "conv2", "order": 1, "verdict": "divergent",
                                      "basis": "values", "metrics": _CONV2},
            "largest_jump": {"name": "conv2", "order": 1, "previous": "conv1",
                             "metric": "rel_l2", "rel_error": 0.000988, "ratio": 8289.7},
            "first_nonfinite": None,
            "tolerances": {"float32": {"rtol": 1.3e-06, "atol": 1e-05}},
            "tensors_only_in_a": [], "tensors_only_in_a_total": 0,
            "tensors_only_in_b": [], "tensors_only_in_b_total": 0,
            "tensors_total": 4, "pending": False,
            "tensors": [
                {"name": "conv1", "kind": "layer", "order": 0, "dtype": "float32",
                 "verdict": "identical", "basis": "hash",
                 "metrics": {**_metrics(0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0),
                             "cosine": None, "sqnr_db": None}},
                {"name": "conv2", "kind": "layer", "order": 1, "dtype": "float32",
                 "verdict": "divergent", "basis": "values", "metrics": _CONV2},
                {"name": "fc1", "kind": "layer", "order": 2, "dtype": "float32",
                 "verdict": "divergent", "basis": "values",
                 "metrics": _metrics(0.00332, 0.001, 16760.0, 0.99, 0.00101, 1.0, 60.0,
                                     0.001)},
                {"name": "output", "kind": "output", "order": 3, "dtype": "float32",
                 "verdict": "divergent", "basis": "values",
                 "metrics": _metrics(0.00228, 0.001, 16431.0, 1.0, 0.000858, 1.0, 60.0,
                                     0.001)},
            ],
            "origin": {
                "trace_a": "3c0e51a2…", "trace_b": "b81f07d4…", "ops_a": 27, "ops_b": 27,
                "same_sequence": True, "aligned": 27, "aligned_up_to": None,
                "parting": None, "count": 1,
                "ops": [{"seq_a": 4, "seq_b": 4, "op": "aten.convolution.default",
                         "module": "conv2", "phase": "forward", "layer": "conv2",
                         "tensor": "conv2",
                         "inputs": [{"dtype": "float32", "shape": [64, 32, 12, 12]},
                                    {"dtype": "float32", "shape": [64, 32, 5, 5]},
                                    {"dtype": "float32", "shape": [64]}],
                         "outputs": [{"dtype": "float32", "shape": [64, 64, 8, 8]}],
                         "kernel_a": "conv:Mkldnn", "kernel_b": "conv:Mkldnn",
                         "output": {"tensor": "conv2", "verdict": "divergent",
                                    "basis": "values", "metrics": _CONV2, "evidence": ""}}],
            },
            "origin_note": None,
        },
        {
            "suite": "standard", "workload": "cnn", "variant": "tf32", "device": "",
            "a": _SKIPPED, "b": _SKIPPED, "compared": False,
            "inputs": {"input_hash_equal": None, "param_hash_equal": None, "broken": False},
            "notes": [], "summary": None, "first_divergent_layer": None,
            "largest_jump": None, "first_nonfinite": None, "tolerances": {},
            "tensors_only_in_a": [], "tensors_only_in_a_total": 0,
            "tensors_only_in_b": [], "tensors_only_in_b_total": 0, "tensors_total": 0,
            "tensors": [], "pending": False, "origin": None, "origin_note": None,
        },
    ],
    "only_in_a": [],
    "only_in_b": [{"suite": "standard", "workload": "cnn", "variant": "strict",
                   "device": "cpu"}],
}
