"""Output of GET /audit (design §3.3): the summary, then one list per finding, a model
per table row. Field order is the JSON's and the CSV's column order."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from numparity_server.goldens.schemas import PinDriftRow

EXAMPLE: dict[str, Any] = {
    "generated_at": "2026-11-21T10:00:00+00:00",
    "window_days": 14.0,
    "summary": {"nodes": 4, "environments": 2, "ok": 2, "suspect": 1, "watch": 0,
                "nondeterministic": 1, "stale": 0, "policy_violations": 1,
                "broken_inputs": 0},
    "limit": 50, "offset": 0,
    "totals": {"stale": 0, "policy": 1, "suspects": 1, "nondeterministic": 1,
               "broken_inputs": 0, "drift": 0},
    "inventory": {"torch": [{"value": "2.13.0+cpu", "nodes": 4}],
                  "driver": [{"value": None, "nodes": 4}]},
    "stale": [],
    "policy": [{"node": "cpu-4", "env_key": "9f2c…", "attribute": "env_vars.MKL_CBWR",
                "value": "COMPATIBLE", "rule": "allowed", "expected": ["unset"]}],
    "suspects": [{"node": "gpu-node-17", "device": "cuda:3",
                  "device_uuid": "GPU-8f3c2a1e-…", "device_serial": "1324021045632",
                  "device_pci_bus_id": "00000000:47:00.0",
                  "device_name": "NVIDIA A100-SXM4-80GB",
                  "detail": "gpu-node-17 / cuda:3 (NVIDIA A100-SXM4-80GB, UUID GPU-8f3c2a1e-…, "
                            "serial 1324021045632) disagrees with 3 identical peers in 2 runs",
                  "status": "suspect", "env_key": "5be1…", "peers": 3,
                  "majority_nodes": 3,
                  "majority_from": ["gpu-node-03", "gpu-node-05", "gpu-node-09"],
                  "disagreeing_runs": 2, "drill": True,
                  "drill_runs": 2, "currently_disagrees": True,
                  "keys": [{"suite": "standard", "workload": "cnn", "workload_version": 1,
                            "variant": "strict",
                            "device": "cuda/NVIDIA A100-SXM4-80GB/8.0", "runs": 2,
                            "drill_runs": 2}],
                  "compare": {"run_a": "0f1c…", "run_b": "7d3e…", "suite": "standard",
                              "workload": "cnn", "workload_version": 1, "variant": "strict",
                              "device": "cuda/NVIDIA A100-SXM4-80GB/8.0",
                              "device_a": "cuda:0", "device_b": "cuda:3"}}],
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
                          "ratio": 1.25, "ratio_estimate": 1.25, "ratio_uncertainty": 0.04,
                          "note": "1.25× ± 0.04",
                          "workloads": [{"workload": "cnn", "default_s": 0.4,
                                         "strict_s": 0.5, "ratio": 1.25,
                                         "ratio_estimate": 1.25,
                                         "ratio_uncertainty": 0.04}]}],
    "numerics": [{"env_key": "5be1…", "device_model": "AMD EPYC 7B13", "suite": "standard",
                  "variant": "default",
                  "devices": 3, "batch_invariant": False,
                  "batch_invariant_op": "invariance: matmul_k4096",
                  "decode_equals_prefill": True, "decode_equals_prefill_op": None,
                  "attention_backends_agree": True, "attention_backends_agree_op": None,
                  "breaks": [{"workload": "invariance", "check": "batch_invariant",
                              "op": "matmul_k4096", "max_ulp": 12, "max_rel": 3.1e-6,
                              "devices": 3}]}],
    "data_pipeline": [{"env_key": "5be1…", "suite": "standard", "workload": "data",
                       "variant": "default", "devices": 3, "recipe_holds": True,
                       "without": "no_recipe", "without_holds": False, "needs_recipe": True,
                       "workers_agree": False,
                       "recipe_broken": [],
                       "without_broken": ["the order changes between runs (num_workers 0, "
                                          "2)", "jitter repeats in workers 0, 1 "
                                          "(num_workers=2)"],
                       "breaks": [{"configuration": "no_recipe", "check": "streams_distinct",
                                   "op": "jitter", "num_workers": [], "augmentations": [],
                                   "duplicates": [{"augmentation": "jitter", "workers": [0, 1],
                                                   "num_workers": 2}],
                                   "devices": 3,
                                   "words": "jitter repeats in workers 0, 1 "
                                            "(num_workers=2)"}]}],
}


class _Row(BaseModel):
    # Rows are validated from the analysis's dataclasses, read by attribute.
    model_config = ConfigDict(from_attributes=True, extra="forbid")


class NodeStatusCounts(_Row):
    """Nodes and environments, and nodes per status (``analysis.node_status.STATUSES``): what
    ``/metrics`` reads (``service.audit_summary``). A node can count under several."""

    nodes: int
    environments: int  # distinct current environments of the nodes
    ok: int
    suspect: int
    watch: int
    nondeterministic: int
    stale: int
    devices: int = Field(description="Devices that sit on a node (a node's CPU, each GPU "
                                     "or MIG instance)")
    suspect_devices: int
    watched_devices: int


class AuditSummary(NodeStatusCounts):
    policy_violations: int  # nodes breaking a rule
    broken_inputs: int  # nodes with a result on other input or parameter bytes
    off_pin_devices: int = Field(0, description="Devices whose latest answer of a pinned "
                                                "key is not the pinned one (design §3.11)")


class AuditTotals(_Row):
    """How many rows each paged table has in all (its page holds ``limit`` of them)."""

    stale: int
    policy: int
    suspects: int
    nondeterministic: int
    broken_inputs: int
    drift: int
    pinned: int = 0


class InventoryRow(_Row):
    value: str | None
    nodes: int


class StaleRow(_Row):
    node: str
    last_seen: str
    hours_since: float
    last_run_id: str | None


class PolicyRow(_Row):
    node: str
    env_key: str
    attribute: str
    value: str
    rule: str  # allowed or required
    expected: list[str]


class SuspectKeyRow(_Row):
    suite: str
    workload: str
    workload_version: int | None
    variant: str
    device: str
    runs: int
    drill_runs: int


class CompareLink(_Row):
    """A run holding the majority answer (``run_a``, on ``device_a``) and the suspect's
    run (``run_b``, on ``device_b``): ``GET /compare`` with all four compares the two
    devices, also when both are GPUs of one run."""

    run_a: str | None
    run_b: str
    suite: str
    workload: str
    workload_version: int | None
    variant: str
    device: str
    device_a: str | None
    device_b: str


class SuspectRow(_Row):
    """A device that disagrees with its identical peers (same model, same environment:
    other GPUs of its node and of other nodes)."""

    node: str = Field(description="The node the device sits on now")
    device: str = Field(description="Its slot there: cuda:3, cpu")
    device_uuid: str | None = Field(description="GPU or MIG UUID; follows the device "
                                                "from node to node")
    device_serial: str | None
    device_pci_bus_id: str | None
    device_name: str | None
    detail: str = Field(description="One line naming the device, its peers and runs")
    status: Literal["suspect", "watch"]
    env_key: str | None
    peers: int = Field(description="Voters of its model on its environment but itself: "
                                   "each device known by a UUID or serial, and all of a "
                                   "node's devices without one together (design §3.3.12)")
    majority_nodes: int = Field(description="Voters holding the majority answer")
    majority_from: list[str] = Field(description="The nodes whose devices hold the majority "
                                                 "answer: whose evidence judges this device")
    disagreeing_runs: int
    drill: bool
    drill_runs: int
    currently_disagrees: bool
    keys: list[SuspectKeyRow]
    compare: CompareLink


class RepeatsDisagreeRow(_Row):
    node: str
    reason: Literal["repeats_disagree"]
    suite: str
    workload: str
    workload_version: int | None
    variant: str
    device: str
    repeats: int
    run_id: str
    detail: str


class StrictChangedRow(_Row):
    node: str
    reason: Literal["strict_changed"]
    env_key: str
    suite: str
    workload: str
    workload_version: int | None
    variant: str
    device: str
    distinct_answers: int
    run_id: str
    detail: str


NondeterministicRow = Annotated[RepeatsDisagreeRow | StrictChangedRow,
                                Field(discriminator="reason")]


class BrokenInputsRow(_Row):
    node: str
    run_id: str
    suite: str
    workload: str
    workload_version: int | None
    variant: str
    differs: list[str]
    input_hash: str | None
    fleet_input_hash: str | None
    param_hash: str | None
    fleet_param_hash: str | None


class AttributeChangeRow(_Row):
    attribute: str
    before: str
    after: str


class ChangedOutputRow(_Row):
    suite: str
    workload: str
    variant: str
    device: str


class DriftRow(_Row):
    """A node that changed environment between two runs, or (``device`` set) a device
    that moved from ``previous_node`` to ``node`` between two of its runs."""

    node: str
    device: str | None = Field(default=None, description="A moved device's slot on node")
    device_uuid: str | None = None
    previous_node: str | None = Field(default=None,
                                      description="Where the moved device ran before")
    run_id: str
    previous_run_id: str
    started_at: str
    env_key: str
    previous_env_key: str
    attributes: list[AttributeChangeRow]
    outputs_changed: list[ChangedOutputRow]


class _CostRow(_Row):
    default_s: float
    strict_s: float
    ratio: float | None = Field(description="strict / default, only when further from 1 "
                                            "than its uncertainty")
    ratio_estimate: float | None = Field(description="strict / default, always")
    ratio_uncertainty: float | None = Field(description="± on the ratio; null: unknown "
                                                        "(one device, one timed repeat)")


class WorkloadCostRow(_CostRow):
    workload: str


class DeterminismCostRow(_CostRow):
    env_key: str | None
    nodes: int
    note: str = Field(description="The ratio in words, or why it is not shown")
    workloads: list[WorkloadCostRow]


class OpCostRow(_Row):
    """A mode's cost over the nodes' studies, each weighted by its precision (design
    §3.3.12): the median paired ratio to default and its 95 % interval."""

    ratio: float | None = Field(description="wall time against default (1.12: +12 %)")
    uncertainty: float | None = Field(description="half-width of the 95 % interval; null: "
                                                  "unknown")
    low: float | None = Field(description="the 95 % interval's lower end")
    high: float | None = Field(description="the 95 % interval's upper end")
    repeatable: bool | None = Field(description="whether this mode's rounds computed the "
                                                "same bits")
    shown: bool = Field(description="the interval is narrower than the effect (verdict "
                                    "measured)")
    verdict: str = Field(description="measured (the interval is narrower than the effect), "
                                     "negligible (within ± 5 % of no cost) or noisy (not "
                                     "measurable: no figure)")
    words: str = Field(description="What the audit, the dashboard, the CSV and doctor "
                                   "--recipe say: '+12.0 % [+10.1, +14.2]', 'no cost above "
                                   "± 3.0 %', or 'not measurable on this node now (load …)'")
    studies: int = Field(description="the studies (nodes' results) combined")


# A study is what a node's agent reported: the audit names who, and marks its free text
# that reads like a command (analysis.nondeterminism.marked).
CLAIMED_BY = ("The nodes whose studies say this (first 5 by name): a node's claim, not "
              "the server's finding")


class DifferenceSourceRow(_Row):
    """Where a nondeterministic result's difference enters from outside the traced ops
    (design §2.13): host data, a Python choice of tensors, a DataLoader's draw, a
    generator; the op that reads it and the recipe that applies."""

    op: str
    module: str
    phase: str
    source: str = Field(description="host_data, dataloader, order, argument, generator or "
                                    "input")
    what: str
    recipe: str = Field(description="seed_generator, stable_order, dataloader, seed_torch "
                                    "or seed_build")
    advice: str
    at: str | None = Field(description="The code that called the op (file:line in function)")
    results: int
    workloads: list[str]
    variants: list[str]
    claimed_by: list[str] = Field(default_factory=list, description=CLAIMED_BY)


class NondeterministicOpRow(_Row):
    """An op that gave other bits on the same inputs (design §2.13), with the measured
    cost of making only it deterministic next to strict's."""

    op: str = Field(description="The overload, e.g. aten.index_add_.default")
    module: str = Field(description="The module path it ran under ('' outside any)")
    phase: str
    results: int = Field(description="How often: the nondeterministic results naming it")
    workloads: list[str]
    variants: list[str]
    shapes: list[Any]
    dtypes: list[Any]
    kernel: str | None
    recipe: str | None = Field(description="deterministic_algorithms or "
                                           "cudnn_deterministic scoped to the module; null: "
                                           "none in-process (no_recipe says why)")
    no_recipe: str | None
    first: bool = Field(description="The first such op of a result: where its passes part")
    selective: OpCostRow | None
    strict: OpCostRow | None
    cost: str = Field(description="In words: 'selective: +x % [lo, hi]; strict: +y % "
                                  "[lo, hi]', 'not measurable …', or why not")
    claimed_by: list[str] = Field(default_factory=list, description=CLAIMED_BY)


class DeterminismRow(_Row):
    """Per environment and device model: deterministic (every repeated result agreed), or
    the nondeterministic ops (design §3.3.12)."""

    env_key: str | None
    device_model: str
    deterministic: bool
    repeated: int = Field(description="Latest results that ran with two or more repeats")
    disagreeing: int
    summary: str
    cause: str | None = Field(description="Why, where the agent knows (OMP_DYNAMIC)")
    cause_claimed_by: list[str] = Field(default_factory=list, description=(
        "The nodes whose studies say the cause (empty: the environment's own settings "
        "say it)"))
    untraced: list[str] = Field(description="Nondeterministic results without named ops, "
                                            "and how to name them")
    ops_total: int
    ops: list[NondeterministicOpRow]
    sources: list[DifferenceSourceRow] = Field(
        description="Where a difference enters from outside the traced ops, when no op "
                    "gives other bits on the same inputs")


class CheckBreakRow(_Row):
    workload: str
    check: str
    op: str | None = Field(description="Where the two computations first part: the "
                                       "module, probe op or attention backend")
    max_ulp: int | None
    max_rel: float | None
    devices: int


class NumericsRow(_Row):
    """LLM-era numerics of one environment on one device model under one variant
    (design §3.3.12): null where no workload reports the check."""

    env_key: str | None
    device_model: str
    suite: str
    variant: str
    devices: int
    batch_invariant: bool | None
    batch_invariant_op: str | None
    decode_equals_prefill: bool | None
    decode_equals_prefill_op: str | None
    attention_backends_agree: bool | None
    attention_backends_agree_op: str | None
    breaks: list[CheckBreakRow]


class DuplicateRow(_Row):
    augmentation: str = Field(description="The leaf of the batch two workers drew alike")
    workers: list[int]
    num_workers: int


class PipelineBreakRow(_Row):
    configuration: str = Field(description="recipe, no_recipe (the built-in loader without "
                                           "the recipe) or own (a lab's loader as built)")
    check: str = Field(description="order_reproducible, runs_agree, workers_agree or "
                                   "streams_distinct")
    op: str | None = Field(description="The first leaf of the batch that differs, or order")
    num_workers: list[int]
    augmentations: list[str] = Field(description="Every leaf that differs")
    duplicates: list[DuplicateRow]
    devices: int
    words: str


class DataPipelineRow(_Row):
    """The data pipeline of one environment under one workload (design §3.3.12): whether
    the seeds' DataLoader recipe holds (order and batches the same from run to run,
    workers' augmentation streams distinct), what breaks without it, and whether the
    batches depend on the worker count even with it."""

    env_key: str | None
    suite: str
    workload: str
    variant: str
    devices: int
    recipe_holds: bool | None
    without: str | None = Field(description="The configuration without the recipe: "
                                            "no_recipe (data) or own (a lab's loader)")
    without_holds: bool | None
    needs_recipe: bool | None = Field(description="Something the recipe holds breaks "
                                                  "without it")
    workers_agree: bool | None = Field(description="Under the recipe, the same batches at "
                                                   "every worker count")
    recipe_broken: list[str] = Field(description="What breaks with the recipe, in words "
                                                 "(workers_agree apart)")
    without_broken: list[str] = Field(description="What breaks without it, in words "
                                                  "(workers_agree apart)")
    breaks: list[PipelineBreakRow]


class ProofOut(BaseModel):
    """What the benchmarks measured (issue 44, `agent/proof_of_catch.json`): the share of
    injected faults `check`'s plan and the suite see, and the false alarms of honest
    evaluations. The same figures on every node and every request."""

    model_config = ConfigDict(extra="forbid")

    statement: str
    plan: list[str]
    plan_single_bit_seen: float | None = Field(
        description="Share of single-bit faults injected into the plan's op outputs that "
        "changed a recorded bit (seen by comparing with identical peers or a pin)")
    suite_single_bit_seen: float | None
    plan_share_of_suite: float | None = Field(
        description="Of the faults the whole suite sees, the share the plan sees")
    masked: float | None = Field(description="Share of injections no recorded bit shows")
    nan_inf_alone: float | None = Field(
        description="Share of injections a NaN/Inf check alone would see")
    injections: int | None
    coverage_measured_at: str | None
    honest_evaluations: int | None
    false_no_go: int | None
    false_no_go_bound: float | None = Field(
        description="With no false no-go in N honest evaluations: 3/N, the rate's 95 % "
        "upper bound (rule of three)")
    suspects_in_honest_runs: int | None
    conditions: list[str]
    false_alarms_measured_at: str | None


class AuditOut(BaseModel):
    """The audit; ``?format=csv&table=NAME`` gives one of its lists as CSV."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [EXAMPLE]})

    generated_at: str
    window_days: float
    summary: AuditSummary
    limit: int | None = Field(description="Rows per table: stale, policy, suspects, "
                                          "nondeterministic, broken_inputs and drift each "
                                          "hold a page (None: every row, as CSV exports)")
    offset: int = Field(description="Rows of each paged table skipped")
    totals: AuditTotals = Field(description="Rows of each paged table in all")
    inventory: dict[str, list[InventoryRow]]  # promoted environment column → its values
    stale: list[StaleRow]
    policy: list[PolicyRow]
    suspects: list[SuspectRow]
    nondeterministic: list[NondeterministicRow]
    broken_inputs: list[BrokenInputsRow]
    drift: list[DriftRow]
    determinism_cost: list[DeterminismCostRow]
    nondeterministic_ops: list[DeterminismRow] = Field(
        default_factory=list, description="Per environment and device model: deterministic, "
        "or the ops that give other bits on the same inputs and the cost of making only "
        "them deterministic (design §3.3.12)")
    numerics: list[NumericsRow]
    data_pipeline: list[DataPipelineRow]
    pinned: list[PinDriftRow] = Field(
        default_factory=list, description="Drift from the pinned answers (design §3.11): "
        "devices in a pin's scope whose latest answer of a pinned key is another, "
        "`peers_agree` when their whole environment moved together (a page)")
    proof: ProofOut | None = Field(
        default=None, description="What check's plan was measured to see and its false "
        "alarms (bench/coverage.py, bench/false_alarms.py; issue 44)")
