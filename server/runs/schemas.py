"""The run document ``numparity.run/v1`` (design §2.7), as the server validates it.

Unknown fields are ignored (a new field is not a new schema version). Wire arrays are
decoded here, so a broken array is a 422 that names its tensor, and the raw bytes are
kept for storage.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import math
from datetime import datetime, timezone
from typing import Annotated, Any, ClassVar, Literal

import orjson
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

from numparity_server.analysis.tensor_stats import contradictions, stats_from_values
from numparity_server.kit.names import name_problem

SUPPORTED_SCHEMAS = ("numparity.run/v1",)

SHA256_HEX = r"^[0-9a-f]{64}$"
KINDS = ("output", "layer", "grad", "param", "loss", "probe")

# Bytes per element of the dtypes the agent writes (torch names; bfloat16 travels as its
# raw 16-bit patterns).
ITEMSIZE: dict[str, int] = {
    "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8,
    "int8": 1, "int16": 2, "int32": 4, "int64": 8,
    "uint8": 1, "uint16": 2, "uint32": 4, "uint64": 8, "bool": 1,
}


# Limits of one run document (design §2.7 sizes a run at ~36 results and ~400 tensors; a
# custom workload may have many more leaf modules). Each is checked before the items are
# validated, so a document far over a limit is refused cheaply with a 422 naming it.
MAX_RESULTS_PER_RUN = 256
MAX_TENSORS_PER_RESULT = 4096
MAX_LABELS = 64
MAX_DIMS = 32
# reason/error: the agent keeps the last 4,000 characters of a traceback.
MAX_MESSAGE_CHARS = 16_384
# Column limits: Integer is 32-bit and BigInteger 64-bit on PostgreSQL.
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1



def _integral(value: Any) -> Any:
    """JSON has one number type: 3.0 is an integer to JSON Schema (and to orjson a float)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _time_string(value: Any) -> Any:
    """A time travels as an RFC 3339 string; a bare number is not read as a timestamp."""
    if value is not None and not isinstance(value, str):
        raise ValueError("a time is an RFC 3339 string")
    return value


# Integer fields: strict (no "3", no true) but 3.0 is 3. The bounds come before the
# validator so that the OpenAPI schema shows them (minimum, maximum).
Int32 = Annotated[int, Field(ge=0, le=INT32_MAX), BeforeValidator(_integral)]
Time = Annotated[datetime, Field(strict=False), BeforeValidator(_time_string)]

LabelKey = Annotated[str, StringConstraints(min_length=1, max_length=128)]
LabelValue = Annotated[str, StringConstraints(max_length=1024)] | int | float | bool | None
# The most elements a tensor may claim (2**40, 4 TiB of float32): the product of its
# shape, and each count of its statistics. An int64 product of a larger shape can wrap
# negative, and the analysis multiplies shapes.
MAX_TENSOR_ELEMENTS = 2**40
Count = Annotated[int, Field(ge=0, le=MAX_TENSOR_ELEMENTS), BeforeValidator(_integral)]
Dimension = Annotated[int, Field(le=INT64_MAX), BeforeValidator(_integral)]
# The free-form sections (the environment, a result's knobs): how many JSON values each
# may hold and how long a string in it may be. The agent's environment holds ~150 values,
# the longest string (torch's build configuration) ~3,000 characters.
MAX_ENVIRONMENT_VALUES = 10_000
# The agent's environment documents are 5–50 KiB (a GPU node's with its libraries);
# each new env_key stores one whole (issue 30: 32 MiB documents, ×523 on disk).
MAX_ENVIRONMENT_BYTES = 256 * 1024
MAX_KNOBS_VALUES = 1_000
# A result's self-consistency checks (design §2.2): a few per workload, each a verdict
# and what it names (the decoder's backends and skipped ones: a few dozen values).
MAX_CHECKS = 16
MAX_CHECK_VALUES = 500
CheckName = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,63}$")]
MAX_FREE_FORM_CHARS = 65_536
# Tensors up to this many elements always travel with their values (the agent's
# VALUES_MAX); the values of a larger one travel only when the server asked for them,
# and are checked against the hash.
VALUES_ALWAYS_MAX = 4096


class _Wire(BaseModel):
    # Unknown fields are ignored: a new field is not a new schema version (design §2.7).
    # JSON has no NaN or Infinity; pydantic would still read them from strings. Strict:
    # a value of another JSON type than the OpenAPI schema says is refused ("1" for a
    # number, 1 for a boolean), not coerced; times are read from strings (not strict).
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, strict=True)


class WireArray(_Wire):
    """``{"dtype", "data"}``: base64 of little-endian bytes."""

    dtype: str = Field(max_length=32)
    data: str

    @functools.cached_property
    def raw(self) -> bytes:
        """The decoded bytes (a cached property, not a private attribute: pydantic
        initialises private attributes on every model, 20 ms a run of 400 tensors)."""
        try:
            return base64.b64decode(self.data, validate=True)
        except (binascii.Error, ValueError):
            raise ValueError("data is not valid base64") from None

    def decode(self, what: str) -> int:
        """Decode ``data``; the element count. ValueError names ``what`` when it is broken."""
        size = ITEMSIZE.get(self.dtype)
        if size is None:
            raise ValueError(f"{what}: unsupported dtype {self.dtype!r}")
        try:
            raw = self.raw
        except ValueError as exc:
            raise ValueError(f"{what}: {exc}") from None
        if len(raw) % size:
            raise ValueError(f"{what}: {len(raw)} bytes is not a whole number of "
                             f"{self.dtype} elements")
        return len(raw) // size


class SketchArray(WireArray):
    k: Annotated[int, Field(gt=0, le=INT32_MAX), BeforeValidator(_integral)]


class SampleArray(WireArray):
    m: Int32


class TensorStats(_Wire):
    count: Count
    nan: Count
    inf: Count
    pos_inf: Count | None = None  # absent from agents older than the signed counts
    neg_inf: Count | None = None
    zero: Count
    subnormal: Count
    fp16_overflow: Count
    fp16_underflow: Count
    min: float | None = None
    max: float | None = None
    mean: float | None = None
    std: float | None = None
    abs_max: float | None = None
    l2: float | None = None


class TensorEntry(_Wire):
    """A fingerprint (design §2.4), or a bare reference to one: name, kind, order, hash."""

    model_config = ConfigDict(json_schema_extra={"anyOf": [
        {"title": "reference", "description": "name, kind, order and hash of a fingerprint "
                                              "the server holds",
         "properties": {field: {"type": "null"} for field in
                        ("dtype", "shape", "stats", "sketch", "sample", "values")}},
        {"title": "fingerprint", "description": "sketch.k, sample.m and the values' length "
                                                "match their data; values' sha256 is hash",
         "required": ["dtype", "shape"],
         "properties": {"dtype": {"enum": list(ITEMSIZE)},
                        "shape": {"type": "array", "items": {"type": "integer",
                                                             "minimum": 0}}}},
    ]})

    name: str = Field(min_length=1, max_length=512)
    kind: Literal["output", "layer", "grad", "param", "loss", "probe"]
    order: Int32
    hash: str = Field(pattern=SHA256_HEX)
    dtype: str | None = Field(default=None, max_length=32)
    shape: list[Dimension] | None = Field(default=None, max_length=MAX_DIMS)
    stats: TensorStats | None = None
    sketch: SketchArray | None = None
    sample: SampleArray | None = None
    values: WireArray | None = None

    @field_validator("shape")
    @classmethod
    def _bounded_shape(cls, shape: list[int] | None) -> list[int] | None:
        if shape is not None and all(n >= 0 for n in shape):
            elements = math.prod(shape)
            if elements > MAX_TENSOR_ELEMENTS:
                raise ValueError(f"shape {shape} holds {elements} elements; at most "
                                 f"{MAX_TENSOR_ELEMENTS} (2**40)")
        return shape

    @property
    def is_bare(self) -> bool:
        return all(getattr(self, field) is None for field in _FULL_FIELDS)

    @model_validator(mode="after")
    def _check_full_fingerprint(self) -> TensorEntry:
        if self.is_bare:
            return self
        what = f"tensor {self.name!r}"
        if self.dtype is None or self.shape is None:
            missing = "dtype" if self.dtype is None else "shape"
            raise ValueError(f"{what}: a fingerprint needs {missing} (a reference to a known "
                             "fingerprint carries only name, kind, order and hash)")
        if self.dtype not in ITEMSIZE:
            raise ValueError(f"{what}: unsupported dtype {self.dtype!r}")
        if any(n < 0 for n in self.shape):
            raise ValueError(f"{what}: negative dimension in shape {self.shape}")
        if self.sketch is not None:
            k = self.sketch.decode(f"{what} sketch")
            if k != self.sketch.k:
                raise ValueError(f"{what} sketch: data holds {k} elements, k is {self.sketch.k}")
        if self.sample is not None:
            m = self.sample.decode(f"{what} sample")
            if m != self.sample.m:
                raise ValueError(f"{what} sample: data holds {m} elements, m is {self.sample.m}")
        if self.values is not None:
            n = self.values.decode(f"{what} values")
            numel = math.prod(self.shape)
            if n != numel:
                raise ValueError(f"{what} values: data holds {n} {self.values.dtype} elements, "
                                 f"shape {self.shape} needs {numel}")
            self._check_values(what)
        return self

    def _check_values(self, what: str) -> None:
        """Values (always those of a small tensor, a large one's when the server asked)
        must be the bytes the hash names: same dtype, and the agent's sha256 over
        ``dtype;dims;bytes``. A node that sends other bytes under a hash would poison
        every comparison with that hash. Up to ~3 ms of a new environment's run (174
        tensors with values, bench/ingest.py's document)."""
        assert self.values is not None and self.shape is not None
        if self.values.dtype != self.dtype:
            raise ValueError(f"{what} values: dtype {self.values.dtype!r}, but the tensor is "
                             f"{self.dtype!r}")
        digest = hashlib.sha256(f"{self.dtype};{','.join(map(str, self.shape))};".encode())
        digest.update(self.values.raw)
        if digest.hexdigest() != self.hash:
            raise ValueError(f"{what} values: their sha256 is not the tensor's hash "
                             f"{self.hash} (values of other bytes)")
        self._check_stats(what)

    def _check_stats(self, what: str) -> None:
        """The statistics the values give (design §3.1): declared ones that contradict
        them are refused; what is stored is computed, declared or not."""
        assert self.values is not None and self.dtype is not None
        computed = stats_from_values(self.dtype, self.values.raw)
        if self.stats is not None:
            wrong = contradictions(self.stats.model_dump(), computed)
            if wrong:
                raise ValueError(f"{what} stats contradict its values: {'; '.join(wrong)}")
        # Counts and extremes equal; the sums within 1e-9: the values' own are stored.
        self.stats = TensorStats.model_construct(**computed)


_FULL_FIELDS = ("dtype", "shape", "stats", "sketch", "sample", "values")


class _FreeForm(BaseModel):
    """A section whose other fields are kept as sent, bounded by ``check_free_form``."""

    max_values: ClassVar[int]

    @model_validator(mode="before")
    @classmethod
    def _bounded(cls, value: Any) -> Any:
        if isinstance(value, dict):
            check_free_form(value, max_values=cls.max_values)
        return value


class CheckDoc(_FreeForm):
    """One self-consistency check of a result: two ways of computing the same numbers
    compared bit for bit, the distance when they differ, and the operation (module,
    backend, probe) where they first part. Other fields (the decoder's per-backend
    verdicts, the skipped backends) are kept as sent, bounded like knobs."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False, strict=True)
    max_values = MAX_CHECK_VALUES

    equal: bool
    max_ulp: int | None = Field(default=None, ge=0, le=INT64_MAX)
    max_rel: float | None = Field(default=None, ge=0)
    op: str | None = Field(default=None, max_length=255)


# A phase longer than a week is not a measurement.
MAX_PHASE_S = 604_800.0


class PhaseSeconds(_Wire):
    """Seconds per phase of a variant's child or of one workload (design §2.7
    `timeline`): where a variant's time goes. Phases a result does not have are left
    out; the server stores none of it (a run's record of its own cost)."""

    start_s: float | None = Field(default=None, ge=0, le=MAX_PHASE_S)
    import_s: float | None = Field(default=None, ge=0, le=MAX_PHASE_S)
    device_init_s: float | None = Field(default=None, ge=0, le=MAX_PHASE_S)
    environment_s: float | None = Field(default=None, ge=0, le=MAX_PHASE_S)
    build_s: float | None = Field(default=None, ge=0, le=MAX_PHASE_S)
    run_s: float | None = Field(default=None, ge=0, le=MAX_PHASE_S)
    fingerprint_s: float | None = Field(default=None, ge=0, le=MAX_PHASE_S)
    trace_s: float | None = Field(default=None, ge=0, le=MAX_PHASE_S)
    write_s: float | None = Field(default=None, ge=0, le=MAX_PHASE_S)
    other_s: float | None = Field(default=None, ge=0, le=MAX_PHASE_S)


class ChildTimeline(_Wire):
    """One variant child process of a run (design §2.7 `timeline`): the device, the
    variants it ran (several when none sets anything process-wide), its wall time and
    its phases."""

    device: str = Field(min_length=1, max_length=64)
    variants: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(
        default_factory=list, max_length=64)
    wall_s: float | None = Field(default=None, ge=0, le=MAX_PHASE_S)
    phases: PhaseSeconds = Field(default_factory=PhaseSeconds)


# A nondeterministic result's study (design §2.13): the ops named, at most this many.
MAX_NONDETERMINISTIC_OPS = 64
ShortText = Annotated[str, StringConstraints(max_length=512)]


class NondeterministicOpDoc(_Wire):
    """An op whose inputs were the same bits in two traced passes and whose outputs were
    not, with how to make it alone deterministic (design §2.13)."""

    op: str = Field(min_length=1, max_length=256)
    module: str = Field(default="", max_length=1024)
    phase: Literal["forward", "backward", "optimizer"] = "forward"
    index: Int32 = 0
    count: Int32 = 1
    shapes: list[list[Dimension] | None] = Field(default_factory=list, max_length=64)
    dtypes: list[Annotated[str, StringConstraints(max_length=32)] | None] = Field(
        default_factory=list, max_length=64)
    kernel: str | None = Field(default=None, max_length=1024)
    recipe: Literal["deterministic_algorithms", "cudnn_deterministic"] | None = None
    flags: list[ShortText] = Field(default_factory=list, max_length=8)
    tried: bool = False
    no_recipe: str | None = Field(default=None, max_length=2048)


class StudyModeDoc(_Wire):
    """One mode of a cost study: its wall time, spread and whether its rounds agreed;
    for strict and selective the median of its round-by-round ratios to default and that
    median's confidence interval, and the agent's verdict and words of them."""

    wall_s: float = Field(ge=0)
    wall_s_spread: float | None = Field(default=None, ge=0)
    repeatable: bool
    ratio: float | None = Field(default=None, ge=0)
    ratio_low: float | None = Field(default=None, ge=0)
    ratio_high: float | None = Field(default=None, ge=0)
    verdict: Literal["measured", "negligible", "noisy"] | None = None
    cost: str | None = Field(default=None, max_length=512)
    differ: list[Annotated[str, StringConstraints(max_length=1024)]] = Field(
        default_factory=list, max_length=8)


class StudyScopeDoc(_Wire):
    module: str = Field(default="", max_length=1024)
    phases: list[Literal["forward", "backward", "optimizer"]] = Field(max_length=3)
    recipes: list[Literal["deterministic_algorithms", "cudnn_deterministic"]] = Field(
        max_length=2)


class StudyLoadDoc(_Wire):
    """The node's 1-minute load average and usable CPUs when a cost study ended."""

    load: float | None = Field(default=None, ge=0)
    cpus: Int32 | None = None


class CostStudyDoc(_Wire):
    """default, strict (every determinism flag) and selective (only the ops' scopes),
    timed interleaved (design §2.13); no selective mode when no op has a recipe."""

    rounds: Int32
    scopes: list[StudyScopeDoc] = Field(default_factory=list, max_length=64)
    seconds: float | None = Field(default=None, ge=0)
    confidence: float | None = Field(default=None, gt=0, lt=1)
    load: StudyLoadDoc | None = None
    default: StudyModeDoc
    strict: StudyModeDoc
    selective: StudyModeDoc | None = None


class StudyInputDoc(_Wire):
    position: Int32
    dtype: str | None = Field(default=None, max_length=32)
    shape: list[Dimension] | None = Field(default=None, max_length=64)
    name: str | None = Field(default=None, max_length=1024)


class DifferenceSourceDoc(_Wire):
    """Where a difference between two traced passes enters from outside their ops
    (design §2.13): the op that first reads it, its module, phase and caller, what it
    read, and the recipe that applies."""

    op: str = Field(min_length=1, max_length=256)
    module: str = Field(default="", max_length=1024)
    phase: Literal["forward", "backward", "optimizer"] = "forward"
    index: Int32 = 0
    count: Int32 = 1
    source: Literal["host_data", "dataloader", "order", "argument", "generator", "input"]
    what: str = Field(default="", max_length=1024)
    recipe: Literal["seed_generator", "stable_order", "dataloader", "seed_torch",
                    "seed_build"]
    advice: str = Field(default="", max_length=2048)
    input: StudyInputDoc | None = None
    at: str | None = Field(default=None, max_length=1024)
    via: str | None = Field(default=None, max_length=64)


class NondeterminismDoc(_Wire):
    """A result whose repeats disagree: traced, its nondeterministic ops and the cost
    study; untraced, the hint to trace it (design §2.13)."""

    traced: bool
    ops: list[NondeterministicOpDoc] = Field(default_factory=list,
                                             max_length=MAX_NONDETERMINISTIC_OPS)
    sources: list[DifferenceSourceDoc] = Field(default_factory=list,
                                               max_length=MAX_NONDETERMINISTIC_OPS)
    passes_part_at: Int32 | None = None
    cause: str | None = Field(default=None, max_length=2048)
    note: str | None = Field(default=None, max_length=2048)
    hint: str | None = Field(default=None, max_length=2048)
    error: str | None = Field(default=None, max_length=MAX_MESSAGE_CHARS)
    cost: CostStudyDoc | None = None


# A compiled result's record (design §2.14): its compile passes (one per repeat) and
# where it parts from eager. Bounded field by field: what is stored of it is at most a
# few kilobytes per result (runs.service keeps the first MAX_STORED_COMPILE_PASSES).
MAX_COMPILE_PASSES = 10_000
MAX_STORED_COMPILE_PASSES = 16
MAX_KERNELS = 64


class CompilePassDoc(_Wire):
    """One compile of the workload: its seconds (compile and one run), Inductor's cache
    hits and misses, the graphs dynamo made."""

    seconds: float = Field(ge=0, le=MAX_PHASE_S)
    cache_hits: Int32 = 0
    cache_misses: Int32 = 0
    graphs: Int32 = 0


class CompileDoc(_Wire):
    """How a compiled result was compiled: each pass, and the seconds of the first cold
    one (it missed Inductor's cache) and of the first warm one (all from the cache)."""

    backend: str | None = Field(default=None, max_length=64)
    mode: str | None = Field(default=None, max_length=64)
    cache_dir: str | None = Field(default=None, max_length=1024)
    passes: list[CompilePassDoc] = Field(default_factory=list, max_length=MAX_COMPILE_PASSES)
    cold_s: float | None = Field(default=None, ge=0, le=MAX_PHASE_S)
    warm_s: float | None = Field(default=None, ge=0, le=MAX_PHASE_S)


class LocalisationDoc(_Wire):
    """Where a compiled result parts from eager (`_compile.localise`): the first leaf
    module whose compiled output differs alone (and Inductor's kernels for it), or none
    (`note`: the difference comes from fusion across modules)."""

    eager_identical: bool | None = None
    first_differing: str | None = Field(default=None, max_length=512)
    differing: Int32 | None = None
    module: str | None = Field(default=None, max_length=512)
    kernels: list[Annotated[str, StringConstraints(max_length=256)]] = Field(
        default_factory=list, max_length=MAX_KERNELS)
    leaves_tried: Int32 | None = None
    candidates: Int32 | None = None
    note: str | None = Field(default=None, max_length=2048)
    error: str | None = Field(default=None, max_length=2048)
    seconds: float | None = Field(default=None, ge=0, le=MAX_PHASE_S)


class ResultDoc(_Wire):
    model_config = ConfigDict(json_schema_extra={"allOf": [
        {"if": {"properties": {"status": {"const": status}}},
         "then": {"required": [needs], "properties": {needs: {"type": "string",
                                                             "minLength": 1}}}}
        for status, needs in (("skipped", "reason"), ("failed", "error"))]})

    suite: str = Field(default="standard", min_length=1, max_length=64)
    workload: str = Field(min_length=1, max_length=128)
    workload_version: Int32 | None = None
    variant: str = Field(min_length=1, max_length=64)
    device: str = Field(default="", max_length=64)
    status: Literal["ok", "skipped", "failed"]
    reason: str | None = Field(default=None, max_length=MAX_MESSAGE_CHARS)
    error: str | None = Field(default=None, max_length=MAX_MESSAGE_CHARS)
    input_hash: str | None = Field(default=None, max_length=128)
    param_hash: str | None = Field(default=None, max_length=128)
    repeats: Int32 | None = None
    repeats_agree: bool | None = None
    wall_s: float | None = Field(default=None, ge=0)
    wall_s_spread: float | None = Field(
        default=None, ge=0, description="Half the range of the timed repeats' wall times")
    knobs: dict[str, Any] | None = None
    checks: dict[CheckName, CheckDoc] | None = Field(default=None, max_length=MAX_CHECKS)
    tensors: list[TensorEntry] = Field(default_factory=list, max_length=MAX_TENSORS_PER_RESULT)
    # The hash of a manifest the server already has, instead of the tensor list: what an
    # agent on a known environment sends (the sha256 of the ordered (name, kind, hash)
    # triples as canonical JSON; see runs.service.manifest_hash).
    manifest: str | None = Field(default=None, pattern=SHA256_HEX)
    # The hash of the result's op trace (`run --trace-ops`): its body is in the document's
    # `traces`, or stored on the server already (design §2.7).
    trace: str | None = Field(default=None, pattern=SHA256_HEX)
    # Where the workload's time went (build, run, fingerprint, trace): validated, not
    # stored.
    timeline: PhaseSeconds | None = None
    # A result whose repeats disagree (design §2.13): stored on the result, as its time is.
    nondeterminism: NondeterminismDoc | None = None
    # A compiled result's compile passes and where it parts from eager (design §2.14):
    # stored on the result, as its time is.
    compile: CompileDoc | None = None
    localisation: LocalisationDoc | None = None

    @field_validator("knobs")
    @classmethod
    def _bounded_knobs(cls, knobs: dict[str, Any] | None) -> dict[str, Any] | None:
        if knobs is not None:
            check_free_form(knobs, max_values=MAX_KNOBS_VALUES)
        return knobs

    @model_validator(mode="after")
    def _check(self) -> ResultDoc:
        if self.status == "skipped" and not self.reason:
            raise ValueError("a skipped result needs a reason")
        if self.status == "failed" and not self.error:
            raise ValueError("a failed result needs an error")
        seen: set[str] = set()
        for tensor in self.tensors:
            if tensor.name in seen:
                raise ValueError(f"tensor name {tensor.name!r} appears twice")
            seen.add(tensor.name)
        return self


class NodeDoc(_Wire):
    name: str = Field(min_length=1, max_length=255)
    labels: dict[LabelKey, LabelValue] = Field(default_factory=dict, max_length=MAX_LABELS)

    @field_validator("name")
    @classmethod
    def _visible(cls, value: str) -> str:
        problem = name_problem(value)
        if problem is not None:
            raise ValueError(f"a node name {problem}")
        return value


class EnvironmentDoc(_FreeForm):
    """The environment document: free-form, but keyed by ``env_key`` (design §2.5), and at
    most ``MAX_ENVIRONMENT_BYTES`` as compact JSON: it is stored whole for each new
    env_key, so its size is what a new environment costs the disk."""

    model_config = ConfigDict(extra="allow")
    max_values = MAX_ENVIRONMENT_VALUES

    env_key: str = Field(pattern=SHA256_HEX)

    @model_validator(mode="before")
    @classmethod
    def _small(cls, value: Any) -> Any:
        if isinstance(value, dict):
            try:
                size = len(orjson.dumps(value))
            except (TypeError, orjson.JSONEncodeError):
                return value  # a value the fields refuse with their own message
            if size > MAX_ENVIRONMENT_BYTES:
                raise ValueError(f"the environment document is {size:,} bytes as compact "
                                 f"JSON; at most {MAX_ENVIRONMENT_BYTES:,}")
        return value


def check_free_form(section: dict[str, Any], *, max_values: int) -> None:
    """ValueError when a free-form section holds more than ``max_values`` values or a
    string longer than ``MAX_FREE_FORM_CHARS`` (its depth is bounded for the whole body,
    kit.body.MAX_JSON_DEPTH)."""
    stack: list[Any] = [section]
    values = 0
    while stack:
        value = stack.pop()
        values += len(value)
        if values > max_values:
            raise ValueError(f"holds more than {max_values} JSON values")
        for item in (value.values() if isinstance(value, dict) else value):
            if isinstance(item, (dict, list)):
                stack.append(item)
            elif isinstance(item, str) and len(item) > MAX_FREE_FORM_CHARS:
                raise ValueError(f"holds a string of {len(item)} characters; at most "
                                 f"{MAX_FREE_FORM_CHARS}")
        if isinstance(value, dict) and any(len(key) > MAX_FREE_FORM_CHARS for key in value):
            raise ValueError(f"holds a key longer than {MAX_FREE_FORM_CHARS} characters")


MAX_DEVICES_PER_RUN = 64
# GPUs and MIG instances a node may list in `node_gpus` (8 GPUs of 7 instances fit).
MAX_NODE_GPUS = 1024

# Op traces (design §2.7, `run --trace-ops`). The standard suite's largest trace, train's
# three steps, holds a few thousand ops; the limits leave room for user workloads and
# keep a trace's validation under half a second.
TRACE_FORMAT = "numparity.trace/v1"
TRACE_HASH_CHARS = 16
MAX_TRACES_PER_RUN = 256
MAX_OPS_PER_TRACE = 50_000
MAX_TENSORS_PER_TRACE = 200_000
MAX_OP_TENSORS = 64
TRACE_REF = r"^[0-9a-f]{16}$"

# A tensor of a trace: the first 16 hex digits of its fingerprint hash.
TraceRef = Annotated[str, Field(pattern=TRACE_REF)]
TraceDimension = Annotated[int, Field(ge=0, le=INT64_MAX), BeforeValidator(_integral)]
# [dtype, shape]: a JSON array of two items (a tuple, read from a list: not strict there,
# its items are).
TraceTensor = Annotated[
    tuple[Annotated[str, Field(min_length=1, max_length=32)],
          Annotated[list[TraceDimension], Field(max_length=MAX_DIMS)]],
    Field(strict=False),
]


class TraceOp(_Wire):
    """One aten operation, in execution order (its index in ``ops`` is its sequence
    number)."""

    op: str = Field(min_length=1, max_length=256,
                    description="The overload, str(OpOverload): aten.addmm.default")
    module: str = Field(max_length=512, description='The module path it ran under ("" '
                                                    "outside any)")
    phase: Literal["forward", "backward", "optimizer"]
    inputs: list[TraceRef] = Field(alias="in", max_length=MAX_OP_TENSORS,
                                   description="Tensor inputs in argument order (flattened)")
    out: list[TraceRef] = Field(max_length=MAX_OP_TENSORS, description="Tensor outputs")
    args: TraceRef | None = Field(
        default=None, description="16 hex of the sha256 of the non-tensor arguments' repr")
    kernel: str | None = Field(default=None, max_length=4096,
                               description="What the backend chose: sdpa:flash, conv:Mkldnn, "
                                           "CUDA kernel names")


class TraceBody(_Wire):
    """An op trace; ``hash`` is the sha256 of the canonical JSON of the rest (sorted keys,
    compact, UTF-8: design §2.7)."""

    hash: str = Field(pattern=SHA256_HEX)
    format: Literal["numparity.trace/v1"]
    hash_chars: Literal[16]
    tensors: dict[TraceRef, TraceTensor] = Field(
        max_length=MAX_TENSORS_PER_TRACE, json_schema_extra={"additionalProperties": False},
        description="Every reference the ops use → [dtype, shape]")
    ops: list[TraceOp] = Field(max_length=MAX_OPS_PER_TRACE)

    @model_validator(mode="after")
    def _references_known(self) -> TraceBody:
        tensors = self.tensors
        for seq, op in enumerate(self.ops):
            for field, refs in (("in", op.inputs), ("out", op.out)):
                for ref in refs:
                    if ref not in tensors:
                        raise ValueError(f"trace {self.hash}: ops[{seq}].{field} refers to "
                                         f"{ref}, which is not a key of tensors")
        return self


# One NVML reading (`_telemetry`): a count, a temperature, a clock, watts, or a flag.
Reading = bool | int | float


class DeviceTelemetry(_Wire):
    """A GPU's NVML readings at the run's start and end (design §2.7, issue 44), each at
    most 32 named numbers."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)

    start: dict[Annotated[str, Field(max_length=64)], Reading] | None = Field(
        default=None, max_length=32)
    end: dict[Annotated[str, Field(max_length=64)], Reading] | None = Field(
        default=None, max_length=32)


class DeviceDoc(_Wire):
    """A device the run used (design §2.7): its slot, which the results name, and what
    identifies it wherever it sits (UUID, serial, PCI bus id)."""

    device: str = Field(min_length=1, max_length=64)
    type: str = Field(default="", max_length=16)
    index: Int32 | None = None
    uuid: str | None = Field(default=None, max_length=128)
    serial: str | None = Field(default=None, max_length=128)
    pci_bus_id: str | None = Field(default=None, max_length=64)
    name: str | None = Field(default=None, max_length=255)
    compute_capability: str | None = Field(default=None, max_length=16)
    mig: bool = False
    wall_s: float | None = Field(default=None, ge=0)
    status: str | None = Field(default=None, max_length=16)
    telemetry: DeviceTelemetry | None = None


class RunDocument(_Wire):
    # Any string reads (an unknown version is a 400 naming the supported ones); the
    # OpenAPI schema says which versions are supported.
    schema_: str = Field(alias="schema", json_schema_extra={"enum": list(SUPPORTED_SCHEMAS)})
    run_id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$")
    node: NodeDoc
    agent_version: str | None = Field(default=None, max_length=64)
    started_at: Time
    finished_at: Time | None = None
    drill: bool = False
    drill_device: str | None = Field(default=None, max_length=64)
    environment: EnvironmentDoc
    results: list[ResultDoc] = Field(default_factory=list, max_length=MAX_RESULTS_PER_RUN)
    devices: list[DeviceDoc] | None = Field(default=None, max_length=MAX_DEVICES_PER_RUN)
    # NVML's UUIDs of every GPU and MIG instance of the node, whatever the run was given
    # (a scheduler's CUDA_VISIBLE_DEVICES): a GPU listed here has not left the node.
    node_gpus: list[Annotated[str, StringConstraints(min_length=1, max_length=128)]] | None \
        = Field(default=None, max_length=MAX_NODE_GPUS)
    # The bodies of the results' op traces the server may lack; left out of the document
    # hash (a replay with or without them is the same run).
    traces: list[TraceBody] | None = Field(default=None, max_length=MAX_TRACES_PER_RUN)
    # One entry per variant child process: where the run's time went. Validated, not
    # stored; it counts for idempotence like every field.
    timeline: list[ChildTimeline] | None = Field(default=None,
                                                 max_length=MAX_RESULTS_PER_RUN)

    @field_validator("started_at", "finished_at")
    @classmethod
    def _in_utc(cls, value: datetime | None) -> datetime | None:
        # Stored as UTC; a time that cannot be expressed in UTC (year 1 at +05:00) is refused.
        if value is None or value.tzinfo is None:
            return value
        try:
            return value.astimezone(timezone.utc)
        except (OverflowError, ValueError):
            raise ValueError("time out of range once converted to UTC") from None

    @model_validator(mode="after")
    def _unique_results(self) -> RunDocument:
        seen: set[tuple[str, str, str, str]] = set()
        for result in self.results:
            key = (result.suite, result.workload, result.variant, result.device)
            if key in seen:
                raise ValueError(f"result {key} appears twice")
            seen.add(key)
        if self.devices is not None:
            slots = [device.device for device in self.devices]
            if len(set(slots)) != len(slots):
                raise ValueError("devices: a device slot appears twice")
            unknown = sorted({r.device for r in self.results} - set(slots))
            if unknown:
                raise ValueError(f"results name devices that are not in devices: "
                                 f"{', '.join(map(repr, unknown))}")
        return self


class RunCreated(BaseModel):
    id: int
    run_id: str
    results: int
    # Devices (``uuid:…``, ``serial:…``) this run named that belong to another node: its
    # results of them are kept as the node's claim until an admin confirms the move
    # (`numparity-server device move`, design §3.1).
    claimed_devices: list[str] = Field(default_factory=list)


class ResultSummary(BaseModel):
    suite: str
    workload: str
    workload_version: int | None
    variant: str
    device: str
    status: str
    reason: str | None
    error: str | None
    manifest_hash: str | None
    trace_hash: str | None = Field(None, description="The result's op trace, when traced")
    tensors: int
    repeats: int | None
    repeats_agree: bool | None
    wall_s: float | None




class MissingIn(BaseModel):
    """Tensor hashes, manifest hashes and trace hashes an agent is about to reference."""

    hashes: list[Annotated[str, Field(pattern=SHA256_HEX)]] = Field(default_factory=list,
                                                                    max_length=100_000)
    manifests: list[Annotated[str, Field(pattern=SHA256_HEX)]] = Field(default_factory=list,
                                                                       max_length=10_000)
    values: list[Annotated[str, Field(pattern=SHA256_HEX)]] = Field(
        default_factory=list, max_length=100_000,
        description="Hashes of large tensors whose full values the agent holds and can send")
    traces: list[Annotated[str, Field(pattern=SHA256_HEX)]] = Field(
        default_factory=list, max_length=10_000,
        description="Hashes of op traces the agent is about to refer to")


class MissingOut(BaseModel):
    missing: list[str]
    missing_manifests: list[str] = Field(default_factory=list)
    missing_values: list[str] = Field(
        default_factory=list,
        description="Of the hashes in `values`, those whose full values the server wants: "
                    "it does not hold them. The upload then carries each of these tensors "
                    "as a full fingerprint with its `values`")
    missing_traces: list[str] = Field(
        default_factory=list,
        description="Of the hashes in `traces`, those the server does not store: the upload "
                    "carries their bodies in `traces`")
    max_body_bytes: int | None = Field(
        default=None,
        description="The largest request body the server takes, before and after gzip "
                    "decoding (NUMPARITY_MAX_BODY_BYTES). What would pass it travels in "
                    "parts: a document through PUT /api/v1/uploads/{sha256}, a large "
                    "tensor's values through PUT /api/v1/values/{hash}")


class RunListItem(BaseModel):
    id: int
    run_id: str
    node: str
    env_key: str
    agent_version: str | None
    started_at: datetime
    received_at: datetime
    drill: bool


class RunSummary(RunListItem):
    """One run: its list item, when it finished, and its results."""

    finished_at: datetime | None
    results: list[ResultSummary]
