"""The lab's policy (design §3.3 audit): allowed versions, required knobs, tolerances.

A policy is a plain mapping (the server reads it from a TOML file)::

    stale_after_hours = 48        # a node without a run for longer is stale
    min_peers = 3                 # suspect hardware needs this many same-env peers
    window_days = 14              # history the audit reads (suspects, drift)

    [allowed]                     # attribute -> allowed values (shell-style patterns)
    "torch.version" = ["2.13.*"]
    "gpus.0.driver" = ["550.*", "560.*"]

    [required]                    # attribute -> the one value it must have
    "knobs.cudnn.benchmark" = "false"
    "decoder.batch_invariant" = true   # workload.check -> what the check must say


    [tolerances]                  # every workload, per dtype
    float32 = {rtol = 1e-5, atol = 1e-5}

    [tolerances.workloads.transformer]   # one workload: per dtype, or for all dtypes
    rtol = 1e-4
    atol = 1e-5

Attributes are the dotted paths of the flattened environment (what attribution
prints: ``env_vars.MKL_CBWR``, ``knobs.deterministic_algorithms``); values are compared
as the strings attribution shows (``true``, ``null``, ``unset`` when absent). A required
key ``<workload>.<check>`` naming one of the checks the audit's numerics table shows
(``batch_invariant``, ``decode_equals_prefill``, ``attention_backends_agree``) or a data
pipeline check (``recipe_runs_agree``, …: ``data_pipeline``) is a requirement on the
results instead: every variant's latest result of that workload on
a node must say the check holds (``true``) or does not (``false``).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ._arrays import canonical_dtype
from .data_pipeline import is_pipeline_check
from .environment import UNSET
from .numerics import COLUMNS as CHECK_NAMES
from .tolerance import DEFAULT_TOLERANCES, Tolerance, default_tolerance

_TOP_LEVEL = {"stale_after_hours", "min_peers", "window_days", "allowed", "required",
              "tolerances"}


class PolicyError(ValueError):
    """The policy does not say something this module understands; the message says where."""


@dataclass(frozen=True)
class Violation:
    attribute: str
    value: str
    rule: str  # "allowed" or "required"
    expected: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"attribute": self.attribute, "value": self.value, "rule": self.rule,
                "expected": list(self.expected)}


@dataclass(frozen=True)
class Policy:
    stale_after_hours: float = 48.0
    min_peers: int = 3
    window_days: float = 14.0
    allowed: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    required: Mapping[str, str] = field(default_factory=dict)
    # "workload.check" -> whether it must hold (the [required] keys naming a check)
    required_checks: Mapping[str, bool] = field(default_factory=dict)
    # dtype -> tolerance, for every workload; then workload -> dtype ("*": any) -> tolerance
    tolerances: Mapping[str, Tolerance] = field(default_factory=dict)
    workload_tolerances: Mapping[str, Mapping[str, Tolerance]] = field(default_factory=dict)
    # sha256 of the canonical content, computed once (the server reads its policy at
    # start): the version stored comparisons were computed under (design §3.3.7).
    version: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "version", _version(self))

    def tolerance(self, workload: str | None, dtype: str) -> Tolerance:
        """The tolerance for ``dtype`` in ``workload``: the workload's own, then the
        policy's per-dtype one, then ``torch.testing.assert_close``'s default."""
        name = canonical_dtype(dtype)
        own = self.workload_tolerances.get(workload or "", {})
        return own.get(name) or own.get("*") or self.tolerances.get(name) \
            or default_tolerance(name)

    def violations(self, flattened: Mapping[str, str]) -> list[Violation]:
        """What a flattened environment breaks, by attribute name."""
        found = []
        for attribute, patterns in sorted(self.allowed.items()):
            value = flattened.get(attribute, UNSET)
            if not any(fnmatch.fnmatchcase(value, pattern) for pattern in patterns):
                found.append(Violation(attribute, value, "allowed", patterns))
        for attribute, expected in sorted(self.required.items()):
            value = flattened.get(attribute, UNSET)
            if value != expected:
                found.append(Violation(attribute, value, "required", (expected,)))
        return found


def _version(policy: Policy) -> str:
    """sha256 of the policy's canonical JSON (sorted keys, tolerances as [rtol, atol]),
    with assert_close's default tolerances, which apply where the policy says nothing:
    another policy, or other defaults, is another version. The whole policy counts, not
    only its tolerances (all a comparison reads): an edit costs one recomputation per
    answer, and the version is plainly the file's content."""
    def tolerance(value: Tolerance) -> list[float]:
        return [value.rtol, value.atol]

    content = {
        "stale_after_hours": policy.stale_after_hours, "min_peers": policy.min_peers,
        "window_days": policy.window_days,
        "allowed": {name: list(values) for name, values in policy.allowed.items()},
        "required": dict(policy.required),
        # Only when set: a policy without check requirements kept its version.
        **({"required_checks": dict(policy.required_checks)}
           if policy.required_checks else {}),
        "tolerances": {dtype: tolerance(t) for dtype, t in policy.tolerances.items()},
        "workload_tolerances": {
            workload: {dtype: tolerance(t) for dtype, t in per_dtype.items()}
            for workload, per_dtype in policy.workload_tolerances.items()},
        "default_tolerances": {dtype: tolerance(t)
                               for dtype, t in DEFAULT_TOLERANCES.items()},
    }
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _render(value: Any, where: str) -> str:
    # The same strings flatten_environment produces, so TOML booleans match "true".
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float)):
        return str(value)
    raise PolicyError(f"{where}: expected a string, number or boolean, got {value!r}")


def _number(raw: Mapping[str, Any], name: str, default: float, minimum: float) -> float:
    value = raw.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum:
        raise PolicyError(f"{name}: expected a number >= {minimum}, got {value!r}")
    return float(value)


def _tolerance(raw: Any, where: str) -> Tolerance:
    if not isinstance(raw, Mapping) or set(raw) - {"rtol", "atol"} or not raw:
        raise PolicyError(f"{where}: expected {{rtol = ..., atol = ...}}, got {raw!r}")
    values = {}
    for name in ("rtol", "atol"):
        value = raw.get(name, 0.0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise PolicyError(f"{where}.{name}: expected a number >= 0, got {value!r}")
        values[name] = float(value)
    return Tolerance(**values)


def _per_dtype(raw: Mapping[str, Any], where: str) -> dict[str, Tolerance]:
    out = {}
    for dtype, spec in raw.items():
        try:
            name = canonical_dtype(dtype)
        except ValueError:
            raise PolicyError(f"{where}: unknown dtype {dtype!r}") from None
        out[name] = _tolerance(spec, f"{where}.{dtype}")
    return out


def _tolerances(raw: Any) -> tuple[dict[str, Tolerance], dict[str, dict[str, Tolerance]]]:
    if not isinstance(raw, Mapping):
        raise PolicyError(f"tolerances: expected a table, got {raw!r}")
    raw = dict(raw)
    workloads = raw.pop("workloads", {})
    if not isinstance(workloads, Mapping):
        raise PolicyError(f"tolerances.workloads: expected a table, got {workloads!r}")
    per_workload = {}
    for workload, spec in workloads.items():
        where = f"tolerances.workloads.{workload}"
        if not isinstance(spec, Mapping):
            raise PolicyError(f"{where}: expected a table, got {spec!r}")
        if set(spec) <= {"rtol", "atol"}:
            per_workload[workload] = {"*": _tolerance(spec, where)}
        else:
            per_workload[workload] = _per_dtype(spec, where)
    return _per_dtype(raw, "tolerances"), per_workload


def is_check_key(key: str) -> bool:
    """``<workload>.<check>`` with a check the agent reports (not an environment path): a
    numerics column, or a data pipeline check (``data.recipe_runs_agree``; a lab's
    ``mylab.data:loader.own_runs_agree`` — the check is after the last dot)."""
    workload, _, check = key.rpartition(".")
    return bool(workload) and (check in CHECK_NAMES or is_pipeline_check(check))


def _check_requirement(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise PolicyError(f"required.{key}: a check is required to hold (true) or not "
                          f"(false), got {value!r}")
    return value


def parse_policy(raw: Mapping[str, Any]) -> Policy:
    """A Policy from its mapping; PolicyError naming the first thing that is wrong."""
    unknown = sorted(set(raw) - _TOP_LEVEL)
    if unknown:
        raise PolicyError(f"unknown setting(s) {', '.join(unknown)}; "
                          f"known: {', '.join(sorted(_TOP_LEVEL))}")
    allowed_raw = raw.get("allowed", {})
    required_raw = raw.get("required", {})
    if not isinstance(allowed_raw, Mapping) or not isinstance(required_raw, Mapping):
        raise PolicyError("allowed and required must be tables of attribute = value(s)")
    allowed = {}
    for attribute, values in allowed_raw.items():
        values = values if isinstance(values, list) else [values]
        allowed[attribute] = tuple(_render(v, f"allowed.{attribute}") for v in values)
    required_checks = {key: _check_requirement(key, value)
                       for key, value in required_raw.items() if is_check_key(key)}
    required = {attribute: _render(value, f"required.{attribute}")
                for attribute, value in required_raw.items() if not is_check_key(attribute)}
    tolerances, per_workload = _tolerances(raw.get("tolerances", {}))
    min_peers = _number(raw, "min_peers", 3, 1)
    if min_peers != int(min_peers):
        raise PolicyError(f"min_peers: expected a whole number, got {raw['min_peers']!r}")
    return Policy(
        stale_after_hours=_number(raw, "stale_after_hours", 48.0, 0.0),
        min_peers=int(min_peers),
        window_days=_number(raw, "window_days", 14.0, 0.0),
        allowed=allowed,
        required=required,
        required_checks=required_checks,
        tolerances=tolerances,
        workload_tolerances=per_workload,
    )
