"""The explain routes' models (design §2.11, §3.2): the reference an agent reads, and the
findings document ``numparity.explain/v1`` it posts, as the server validates it.

The findings document mirrors ``numparity_agent._explain.explanation_document``; like the
run document, unknown fields are ignored, a value of another JSON type is refused rather
than coerced, and every string, list and number is bounded.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from numparity_server.reads.explanations import ExplanationOut, Status, Target
from numparity_server.runs.schemas import MAX_MESSAGE_CHARS, Int32, Time

SUPPORTED_SCHEMAS = ("numparity.explain/v1",)
MAX_FINDINGS = 256
# A setting is one candidate of explain: one variable or knob, or a pair. 32 leaves room
# for larger candidates without letting a document carry an environment's worth.
MAX_SETTING_ENTRIES = 32
# A label is the setting in words (`MKL_CBWR=COMPATIBLE, threads=2`).
MAX_LABEL_CHARS = 4096
# The run document's run_id (runs.schemas.RunDocument).
RUN_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$"
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

SettingName = Annotated[str, StringConstraints(min_length=1, max_length=128)]
SettingText = Annotated[str, StringConstraints(max_length=1024)]
# A knob's value as the agent sends it: on/off, a thread count, a precision or backend
# name. Integers fit a database's 64 bits.
KnobValue = bool | Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)] | float | SettingText | None


class _Wire(BaseModel):
    # As runs.schemas: unknown fields ignored, no NaN or Infinity, no coercion.
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, strict=True)


class SettingDoc(_Wire):
    """Environment variables set before torch starts (null: unset) and knobs set in the
    process (design §2.11's table)."""

    env: dict[SettingName, SettingText | None] = Field(default_factory=dict,
                                                       max_length=MAX_SETTING_ENTRIES)
    knobs: dict[SettingName, KnobValue] = Field(default_factory=dict,
                                                max_length=MAX_SETTING_ENTRIES)


class ClosestDoc(_Wire):
    label: str = Field(max_length=MAX_LABEL_CHARS)
    setting: SettingDoc
    matching: Int32
    tensors: Int32
    first_differing: str | None = Field(default=None, max_length=512)


class FindingDoc(_Wire):
    """One result of the reference run: its key and device, and what explain found."""

    model_config = ConfigDict(json_schema_extra={"allOf": [
        {"if": {"properties": {"status": {"const": "reproduced"}}},
         "then": {"required": ["setting"], "properties": {"setting": {"type": "object"}}}}]})

    suite: str = Field(default="standard", min_length=1, max_length=64)
    workload: str = Field(min_length=1, max_length=128)
    workload_version: Int32 | None = None
    variant: str = Field(min_length=1, max_length=64)
    device: str = Field(default="", max_length=64, description="the reference result's device")
    status: Status
    setting: SettingDoc | None = None
    label: str | None = Field(default=None, max_length=MAX_LABEL_CHARS)
    tried: Int32 = 0
    seconds: float = Field(default=0.0, ge=0)
    closest: ClosestDoc | None = None
    detail: str | None = Field(default=None, max_length=MAX_MESSAGE_CHARS)

    @property
    def key(self) -> tuple[str, str, str, str]:
        return self.suite, self.workload, self.variant, self.device

    @model_validator(mode="after")
    def _reproduced_by_a_setting(self) -> FindingDoc:
        if self.status == "reproduced" and self.setting is None:
            raise ValueError("a reproduced finding needs the setting that reproduced it")
        return self


class ExplanationDocument(_Wire):
    """``numparity.explain/v1``: what ``numparity-agent explain`` found on ``node``
    (computing on ``device``) against run ``against``."""

    # Any string reads (an unknown version is a 400 naming the supported ones); the
    # OpenAPI schema says which versions are supported.
    schema_: str = Field(alias="schema", json_schema_extra={"enum": list(SUPPORTED_SCHEMAS)})
    node: str = Field(min_length=1, max_length=255)
    against: str = Field(pattern=RUN_ID_PATTERN, description="the reference run's run_id")
    device: str = Field(default="", max_length=64,
                        description="the device this node computed on")
    env_key: str | None = Field(
        default=None, pattern=r"^[0-9a-f]{64}$",
        description="the environment explain computed in (the node as configured where "
                    "it ran); the node's newest environment when absent or unknown")
    target: Target = Field(
        default="run",
        description="run: each finding is about giving run `against`'s result's bits; "
                    "eager: about the node's compiled result giving the same run's eager "
                    "(default) answer on that device (design §2.14)")
    started_at: Time
    finished_at: Time
    findings: list[FindingDoc] = Field(max_length=MAX_FINDINGS)

    @model_validator(mode="after")
    def _one_finding_per_result(self) -> ExplanationDocument:
        seen: set[tuple[str, str, str, str]] = set()
        for finding in self.findings:
            if finding.key in seen:
                raise ValueError(f"a finding of result {finding.key} appears twice")
            seen.add(finding.key)
        return self


class ExplanationsStored(BaseModel):
    stored: int = Field(description="findings stored (one row each)")


# ---- GET /agent/reference/{run_id}: only what explain needs ------------------------------


class ReferenceThreads(BaseModel):
    num_threads: int | None
    num_interop_threads: int | None


class ReferenceCpu(BaseModel):
    model: str | None
    capability: str | None
    logical_cpus: int | None


class ReferenceTorch(BaseModel):
    version: str | None
    git_version: str | None
    cuda: str | None
    cudnn: int | str | None
    mkl_available: bool | None
    mkldnn_available: bool | None


class ReferenceGpu(BaseModel):
    name: str | None
    compute_capability: str | None


class ReferenceEnvironment(BaseModel):
    """The reference run's numeric environment: what explain compares with this node's to
    try the differences first. No host name, GPU UUID or serial, labels or node name."""

    env_key: str
    env_vars: dict[str, str]
    threads: ReferenceThreads
    knobs: dict[str, bool | int | float | str | None]
    cpu: ReferenceCpu
    torch: ReferenceTorch
    gpus: list[ReferenceGpu]


class ReferenceTensor(BaseModel):
    name: str
    kind: str
    hash: str


class ReferenceResult(BaseModel):
    suite: str
    workload: str
    workload_version: int | None
    variant: str
    device: str
    status: Literal["ok"]
    input_hash: str | None
    param_hash: str | None
    tensors: list[ReferenceTensor] = Field(description="in execution order")


class ReferenceOut(BaseModel):
    """A run as explain reads it: its ok results' tensor hashes and its environment."""

    run_id: str
    environment: ReferenceEnvironment
    results: list[ReferenceResult]


__all__ = [
    "ClosestDoc", "ExplanationDocument", "ExplanationOut", "ExplanationsStored", "FindingDoc",
    "ReferenceOut", "SettingDoc",
]
