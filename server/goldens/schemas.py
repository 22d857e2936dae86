"""Pinned answers on the wire (design §3.11): a pin asked for, a version of a pin, the
drift from it, and what `numparity-agent check` is answered."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

_STRICT = ConfigDict(extra="forbid")
# Bodies: a value of another JSON type is refused, not coerced (as the run document's).
_BODY = ConfigDict(extra="forbid", strict=True)

Name = Annotated[str, StringConstraints(min_length=1, max_length=128)]
Short = Annotated[str, StringConstraints(min_length=1, max_length=64)]
AttributeValue = Annotated[str, StringConstraints(max_length=255)]


class PinIn(BaseModel):
    """What to pin: a device model's answers on an environment or a software stack, from
    the fleet's current majority or from one run (design §3.11)."""

    model_config = _BODY
    source: Literal["majority", "run"] = Field(
        description="majority: per workload and variant the answer more than half of the "
                    "devices in scope give now; run: the answers of one run's device")
    reason: Annotated[str, StringConstraints(min_length=1, max_length=4096)] = Field(
        description="Why: shown with the pin wherever it is used")
    suite: Short = "standard"
    run_id: Short | None = Field(None, description="source=run: the run")
    device: Short | None = Field(None, description="source=run: the run's device slot "
                                                   "(default its first of `model`)")
    model: Annotated[str, StringConstraints(min_length=1, max_length=320)] | None = Field(
        None, description="The device model (`cpu`, `cuda/NAME/CC`); default the run's "
                          "device's, or the model of the environment's devices when it has "
                          "one")
    env_key: Short | None = Field(None, description="source=majority: the environment "
                                                    "whose stack (or itself) is pinned")
    node: Annotated[str, StringConstraints(min_length=1, max_length=255)] | None = Field(
        None, description="source=majority: the node whose current environment is meant")
    scope: Literal["stack", "environment"] = Field(
        "stack", description="stack: the device model with the environment's torch, CUDA "
                             "and cuDNN (and the CPU's model on the CPU); environment: that "
                             "env_key alone")
    match: dict[Annotated[str, StringConstraints(max_length=32)], AttributeValue | None] = Field(
        default_factory=dict, max_length=8,
        description="Stack attributes to add or override (gpu_name, compute_capability, "
                    "driver, cuda, cudnn, torch, cpu_capability, cpu_model); null matches "
                    "an environment without the attribute")
    workloads: list[Name] | None = Field(None, max_length=64,
                                         description="Only these workloads")
    variants: list[Short] | None = Field(None, max_length=16,
                                         description="Only these variants")


class UnpinIn(BaseModel):
    model_config = _BODY
    reason: Annotated[str, StringConstraints(min_length=1, max_length=4096)]


class PinnedAnswerOut(BaseModel):
    model_config = _STRICT
    workload: str
    workload_version: int | None
    variant: str
    manifest_hash: str
    input_hash: str | None
    param_hash: str | None
    holders: int = Field(description="Nodes in scope giving this answer when pinned (at "
                                     "least 2 for a pin from the majority; devices for "
                                     "pins made before nodes voted)")
    devices: int = Field(description="Nodes in scope with an answer when pinned")
    held_by: list[str] | None = Field(None, description=(
        "The first nodes by name that held it when pinned (a pin from the majority)"))


class LeftOut(BaseModel):
    model_config = _STRICT
    workload: str
    variant: str
    reason: str


class GoldenOut(BaseModel):
    """One version of a pin. The newest version of a subject (suite, model, scope) is in
    force unless it unpins (`retired`)."""

    model_config = _STRICT
    id: int
    subject: str = Field(description="sha256 of suite, model and scope: the versions of one "
                                     "pin share it")
    suite: str
    model: str
    scope: dict[str, str | None]
    scope_text: str
    version: int
    retired: bool = Field(description="This version unpins the subject")
    in_force: bool
    source: Literal["majority", "run", "unpin"]
    source_run_id: str | None
    source_device: str | None
    reason: str
    pinned_by: str
    pinned_at: datetime
    answers_count: int
    answers: list[PinnedAnswerOut] | None = Field(
        None, description="The pinned answers (GET /goldens/{id}; a list shows counts)")
    left_out: list[LeftOut] | None = Field(
        None, description="When pinned: the keys in scope not pinned, and why")


class GoldenPage(BaseModel):
    model_config = _STRICT
    items: list[GoldenOut]
    total: int
    limit: int
    offset: int


class PinRef(BaseModel):
    model_config = _STRICT
    id: int
    version: int
    model: str
    scope: dict[str, str | None]
    scope_text: str
    pinned_by: str
    pinned_at: datetime
    reason: str


class AgainstPin(BaseModel):
    """An answer against the pinned one (the pinned one as the reference)."""

    model_config = _STRICT
    verdict: str | None = Field(description="The result verdict (its worst tensor's); null: "
                                            "a side's tensors are no longer stored")
    decided_by: str | None
    first_divergent_layer: str | None
    max_abs: float | None = Field(description="Of the deciding tensor, from whole values")


class PinDriftRow(BaseModel):
    """Devices in a pin's scope whose latest answer of a pinned key is not the pinned one
    (the audit's `pinned` table)."""

    model_config = ConfigDict(extra="forbid", from_attributes=True)
    pin_id: int
    pin_version: int
    model: str
    scope: str
    suite: str
    workload: str
    workload_version: int | None
    variant: str
    env_key: str
    devices: int = Field(description="Devices of the environment holding this answer")
    environment_devices: int = Field(description="Devices of the model with an answer there")
    first_node: str
    peers_agree: bool = Field(description="The answer is the environment's usual one: the "
                                          "fleet moved together, not one device")
    pinned_manifest: str
    answer_manifest: str
    verdict: str | None
    decided_by: str | None
    first_divergent_layer: str | None


class DivergencePin(BaseModel):
    """/divergence's view of a pin that has an answer for the key."""

    model_config = _STRICT
    pin: PinRef
    workload_version: int | None
    pinned: str = Field(description="The pinned answer: manifest hash, or with `tensor` that "
                                    "tensor's hash in it")
    pinned_group: int | None = Field(description="The group giving the pinned answer; null: "
                                                 "no device in the fleet gives it now")
    devices_in_scope: int
    devices_on_pin: int
    drift: bool = Field(description="Some device in scope gives another answer")
    in_scope_group: int | None = Field(
        description="The group most devices in scope give, when it is not the pinned one")
    against_pin: AgainstPin | None = Field(
        description="That group's answer against the pinned one (whole results)")


# ---- check ----------------------------------------------------------------------------


class CheckAnswer(BaseModel):
    """One answer `check` compares on each device of the model: its tensors' names and the
    first 16 hex digits of their hashes, in execution order."""

    model_config = _STRICT
    workload: str
    workload_version: int | None
    variant: str
    source: Literal["pin", "fleet"]
    manifest_hash: str
    input_hash: str | None
    param_hash: str | None
    tensors: list[tuple[str, str]]
    holders: int = Field(description="Nodes giving this answer (the pin's when pinned, "
                                     "else this environment's)")
    devices: int = Field(description="Nodes with an answer of the key (voters)")
    held_by: list[str] = Field(default_factory=list,
                               description="The first of the holders by name")


class Undecided(BaseModel):
    """A key the fleet does not decide on this environment: its nodes split without a
    majority, or too few hold its answer. `check` shows it as not compared."""

    model_config = _STRICT
    workload: str
    variant: str
    note: str


class CheckDevice(BaseModel):
    model_config = _STRICT
    model: str
    source: Literal["pin", "fleet", "none"] = Field(
        description="What the device is compared with: the pin in force, the fleet's "
                    "answers on this environment, or nothing (unknown)")
    pin: PinRef | None
    note: str | None
    checks: list[CheckAnswer]
    undecided: list[Undecided] = Field(
        default_factory=list, description="Keys the fleet does not decide here (at most "
        "16, strict first), shown as not compared: never left out in silence")


class CheckPlan(BaseModel):
    """What `numparity-agent check` runs on the devices of each model and the answers it
    expects (design §2.12)."""

    model_config = _STRICT
    suite: str
    env_key: str
    environment_known: bool
    chosen_by: Literal["server", "agent"] = Field(
        description="server: the server chose the workloads (pinned, split, layered, "
                    "within the budget); agent: the ones the agent named")
    devices: list[CheckDevice]
