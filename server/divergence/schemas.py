"""Output of GET /divergence: the key, then the analysis report (design §3.3.7)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from numparity_server.compare.schemas import FirstNonfinite, LargestJump, OriginOut
from numparity_server.goldens.schemas import DivergencePin
from numparity_server.reads.explanations import ExplanationOut

_STRICT = ConfigDict(extra="forbid")


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


class MemberDevice(BaseModel):
    node: str
    device: str


class Representative(BaseModel):
    node: str
    run_id: str
    device: str


class Fp64Judgement(BaseModel):
    """The fp64 judge (design §3.3.8): acceptable ⇔ rmse ≤ multiplier · baseline_rmse +
    the fixed term (``limit`` is the right-hand side)."""

    model_config = _STRICT
    acceptable: bool | None = Field(description="null: an RMSE is missing")
    rmse: float | None
    baseline_rmse: float | None
    multiplier: float
    limit: float | None


class GroupOut(BaseModel):
    model_config = _STRICT
    id: int = Field(description="1..n in the order of the consensus rule: 1 is the usual "
                                "answer, the baseline")
    hash: str = Field(description="The answer: the manifest hash (whole result) or the "
                                  "tensor's hash")
    size: int = Field(description="Members (devices) giving this answer")
    voters: int | None = Field(
        None, description="Voters giving this answer, what orders the groups (design "
                          "§3.3.12): each device known by a UUID or serial, and each "
                          "node's other devices together")
    nodes: list[str] = Field(description="Each member's node (a node once per device in the "
                                         "group), by name: the first `members_limit`")
    nodes_total: int = Field(description="Entries `nodes` would have uncapped (= size)")
    devices: list[MemberDevice] = Field(description="The members that are not a node's CPU, "
                                                    "by node and slot: the first "
                                                    "`members_limit`")
    devices_total: int
    env_keys: list[str] = Field(description="The members' environments: the first "
                                            "`members_limit`")
    env_keys_total: int
    representative: Representative = Field(description="The member with the first node "
                                                       "name, then run id, then slot: the "
                                                       "group's side of every comparison")
    nondeterministic: bool = Field(False, description="Some result giving this answer had "
                                                      "repeats that disagree")
    fp64: Fp64Judgement | None = Field(
        None, description="With a tensor and an fp64-reference answer of it")


class LayerVerdict(BaseModel):
    name: str
    order: int = Field(description="Position in group a's representative's manifest")
    verdict: str
    basis: str
    metrics: dict[str, float | None]


class SeparatingAttribute(BaseModel):
    model_config = _STRICT
    attribute: str
    a: list[str] = Field(description="Its values among group a's members")
    b: list[str] = Field(description="Its values among group b's members")
    a_short: str | None = Field(None, description="For a long value on each side: the part "
                                                  "of a that differs from b")
    b_short: str | None = None


class RankedAttribute(BaseModel):
    model_config = _STRICT
    attribute: str
    blob: bool = Field(description="A long or multi-line value (a build configuration)")
    distinct_values: int
    conditional_entropy: float = Field(description="H(group | attribute) in bits")
    purity: float


class GroupPair(BaseModel):
    """Group b (candidate) compared with group a (reference), from their
    representatives. Everything from `verdict` to `first_nonfinite` is computed once per
    pair of answers and kept; attribution, origin notes and explanations are made per
    request."""

    model_config = _STRICT
    a: int
    b: int
    verdict: str
    basis: str
    metrics: dict[str, float | None]
    evidence: str
    decided_by: str | None = Field(description="Grouping by whole result: the tensor that "
                                               "decided the result verdict; null with a "
                                               "tensor")
    semantics: Literal["cpu", "cuda"] = Field(
        "cpu", description="Whose torch.isclose arithmetic judged closeness: cuda when every "
                           "member of both groups is one and the same CUDA device, else cpu")
    first_divergent_layer: LayerVerdict | None
    largest_jump: LargestJump | None
    first_nonfinite: FirstNonfinite | None
    attribution: list[SeparatingAttribute] = Field(
        description="Environment attributes whose values are disjoint between the groups")
    indistinguishable: bool = Field(description="More than one attribute separates them")
    nondeterministic: bool = Field(
        False, description="A group of the pair is nondeterministic (design §3.3.16): its "
                           "attribution is withheld")
    attribution_withheld: list[SeparatingAttribute] = Field(
        default_factory=list, description="The attributes that separate the groups but "
                                          "are not named as the cause (nondeterministic)")
    attribution_note: str | None = Field(None, description="Why the attribution is withheld")
    origin: OriginOut | None = Field(description="The origin ops of b's representative "
                                                 "against a's (design §3.3.14)")
    origin_note: str | None = Field(description="Why `origin` is null")
    explanations: list[ExplanationOut] = Field(
        default_factory=list, description="What `explain` found between a node of one "
                                          "group and a node of the other (at most 10)")


_METRICS = {"max_abs": 1.27e-07, "max_rel": 0.00236, "max_ulp": 19968.0,
            "mismatch_fraction": 0.0, "rmse": 2.9e-08, "cosine": 1.0, "sqnr_db": 151.2,
            "rel_l2": 2.8e-08, "rel_l2_est": 2.7e-08, "rel_l2_err": 2.4e-09}
EXAMPLE: dict[str, Any] = {
    "key": {"suite": "standard", "workload": "cnn", "workload_version": 1,
            "variant": "default", "tensor": "output"},
    "tensor": "output",
    "baseline": 1,
    "groups": [
        {"id": 1, "hash": "5d1c…", "size": 3, "nodes": ["lab-01", "lab-02", "lab-03"],
         "nodes_total": 3, "devices": [], "devices_total": 0, "env_keys": ["43a0…"],
         "env_keys_total": 1,
         "representative": {"node": "lab-01", "run_id": "0f1c…", "device": "cpu"},
         "fp64": {"acceptable": True, "rmse": 3.1e-08, "baseline_rmse": 3.1e-08,
                  "multiplier": 2.0, "limit": 6.2e-08}},
        {"id": 2, "hash": "9e7a…", "size": 1, "nodes": ["lab-mkl"], "nodes_total": 1,
         "devices": [], "devices_total": 0, "env_keys": ["ee1c…"], "env_keys_total": 1,
         "representative": {"node": "lab-mkl", "run_id": "7d3e…", "device": "cpu"},
         "fp64": {"acceptable": True, "rmse": 3.4e-08, "baseline_rmse": 3.1e-08,
                  "multiplier": 2.0, "limit": 6.2e-08}},
    ],
    "pairs_mode": "baseline",
    "pairs_total": 1,
    "pairs_limit": None,
    "pairs_offset": 0,
    "members_limit": 50,
    "members_offset": 0,
    "pairs": [{
        "a": 1, "b": 2, "verdict": "equivalent", "basis": "values", "metrics": _METRICS,
        "evidence": "", "decided_by": None,
        "first_divergent_layer": {"name": "fc1", "order": 6, "verdict": "equivalent",
                                  "basis": "values", "metrics": _METRICS},
        "largest_jump": {"name": "fc1", "order": 6, "previous": "flatten",
                         "metric": "rel_l2", "rel_error": 3.0e-08, "ratio": 251.7},
        "first_nonfinite": None,
        "attribution": [{"attribute": "env_vars.MKL_CBWR", "a": ["unset"],
                         "b": ["COMPATIBLE"]}],
        "indistinguishable": False,
        "origin": {
            "trace_a": "3c0e51a2…", "trace_b": "b81f07d4…", "ops_a": 27, "ops_b": 27,
            "same_sequence": True, "aligned": 27, "aligned_up_to": None,
            "parting": None, "count": 1,
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
        "explanations": [],
    }],
    "attribution": [{"attribute": "env_vars.MKL_CBWR", "blob": False, "distinct_values": 2,
                     "conditional_entropy": 0.0, "purity": 1.0}],
    "members_without_tensor": [],
    "members_without_tensor_total": 0,
    "origin_note": None,
    "excluded": [],
    "excluded_total": 0,
}


class DivergenceOut(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [EXAMPLE]})

    key: DivergenceKey
    tensor: str | None = Field(description="The tensor grouped by; null: the whole result")
    baseline: int = Field(description="The baseline group's id (1): the usual answer "
                                      "(design §3.3.6), which every other group is "
                                      "compared with")
    groups: list[GroupOut] = Field(description="Every group (distinct answer), members "
                                               "capped at `members_limit`")
    pairs_mode: Literal["baseline", "all"] = Field(
        description="baseline: `pairs` compares the baseline with each other group "
                    "(groups − 1 pairs); all: a page of the full matrix (every pair i < j, "
                    "group j against group i, in order)")
    pairs_total: int = Field(description="Pairs in the mode: groups − 1, or groups · "
                                         "(groups − 1) / 2")
    pairs_limit: int | None = Field(description="The page size (null: every pair of the "
                                                "mode, the baseline's default)")
    pairs_offset: int
    members_limit: int | None = Field(description="How many members each list of a group "
                                                  "(and `members_without_tensor`, "
                                                  "`excluded`) shows")
    members_offset: int = Field(0, description="Members each of those lists skips (by "
                                               "node name): the lists' page")
    pairs: list[GroupPair]
    attribution: list[RankedAttribute] = Field(
        description="Every attribute that varies over the key's members, the best "
                    "predictor of the group first")
    nondeterministic_groups: list[int] = Field(
        default_factory=list, description="Groups some of whose results had repeats that "
                                          "disagree: an attribute predicting them is no "
                                          "cause (design §3.3.16)")
    members_without_tensor: list[str] = Field(
        description="Nodes whose result lacks `tensor`: the first `members_limit`")
    members_without_tensor_total: int
    origin_note: str | None = Field(
        None, description="Set when some pairs of a page of the full matrix have no origin "
                          "ops because none were asked (`pairs_origin`). Each pair's "
                          "`origin` has the shape of /compare's, or is null with its "
                          "`origin_note` saying why")
    excluded: list[Excluded] = Field(description="Results left out (another workload "
                                                 "version, broken inputs), with why: the "
                                                 "first `members_limit`")
    excluded_total: int
    pins: list[DivergencePin] = Field(
        default_factory=list, description="Each pin in force with an answer for the key "
        "(design §3.11): the group giving the pinned answer (null when no device does now: "
        "the fleet moved) and the devices in its scope that give another")
    pending: int = Field(0, description="Origin ops not computed yet: this request's "
                                        "computing time (NUMPARITY_COMPUTE_SECONDS) ran out "
                                        "before them (their `origin_note` says so); ask "
                                        "again and the answer goes on where it stopped")
