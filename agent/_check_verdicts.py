"""What `numparity-agent check` concludes (design §2.12): each expected answer against a
device's result, a verdict per device, the node's cause and its exit code.

This module does not import torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from numparity_agent._upload import manifest_hash

EXIT_GO = 0
EXIT_REFUSED = 5
EXIT_DIFFERS = 10
EXIT_UNKNOWN = 11
EXIT_UNREACHABLE = 12
EXIT_FAILED = 13
EXIT_OUT_OF_TIME = 14
# Which cause decides the exit code when several devices have one: what a device does
# wrong first, then what could not be told.
PRECEDENCE = (EXIT_DIFFERS, EXIT_FAILED, EXIT_OUT_OF_TIME, EXIT_UNKNOWN, EXIT_REFUSED,
              EXIT_UNREACHABLE)
# The variant `--fault-drill` corrupts (`_variants.FAULT_DRILL_VARIANT`; this module
# imports neither the variants nor torch).
DRILLED_VARIANT = "strict"
# Causes that say nothing about the devices: `--fail-open` lets the job start on them
# (never a drill's: a drilled device's check that cannot tell must not read as a go).
UNDETERMINED = frozenset({EXIT_OUT_OF_TIME, EXIT_UNKNOWN, EXIT_REFUSED, EXIT_UNREACHABLE})
CAUSES = {
    EXIT_DIFFERS: "a device differs from the pinned or fleet answer",
    EXIT_FAILED: "a device could not compute the check (crash, error)",
    EXIT_OUT_OF_TIME: "not finished within --max-seconds",
    EXIT_UNKNOWN: "cannot tell: no pin and no fleet answer to compare with",
    EXIT_REFUSED: "the server refused the token (401/403)",
    EXIT_UNREACHABLE: "the server was unreachable or could not answer",
}

CHECK_EXIT_CODES_HELP = """\
check exit codes:
  0  go: every device gives the pinned (or fleet) answers; also any cause
     below but 10 and 13 with --fail-open (never with --fault-drill)
  2  usage (a bad option, a device the node does not show)
  5  the server refused the token (401/403)
  10 no-go: a device's answer differs from the pin or the fleet
  11 cannot tell: neither a pin nor fleet answers to compare with (none,
     or split without a majority of several nodes), or the drilled variant
     was not compared
  12 the server was unreachable, busy or could not answer
  13 no-go: a device could not compute the check (its child crashed, an error)
  14 not finished within --max-seconds (default 60)
  when several apply: the first of 10, 13, 14, 11, 5, 12"""


@dataclass
class KeyVerdict:
    """One expected answer on one device: `match`, `differs`, `failed`, `timeout` or
    `unchecked` (skipped, another workload version: nothing to compare)."""

    workload: str
    variant: str
    source: str
    status: str = "unchecked"
    detail: str = ""
    first_differing: str | None = None

    @property
    def key(self) -> str:
        return f"{self.workload}/{self.variant}"

    def to_json(self) -> dict[str, Any]:
        return {"workload": self.workload, "variant": self.variant, "source": self.source,
                "status": self.status, "detail": self.detail,
                "first_differing": self.first_differing}


@dataclass
class DeviceVerdict:
    device: str
    name: str | None
    uuid: str | None
    model: str
    source: str = "none"  # pin | fleet | none
    against: str = ""  # what it is compared with, in words
    note: str | None = None
    keys: list[KeyVerdict] = field(default_factory=list)
    seconds: float = 0.0
    drilled: bool = False  # --fault-drill corrupts this device's strict variant

    @property
    def code(self) -> int:
        """The cause this device gives (0: go). A drilled device whose corrupted variant
        was not compared cannot tell: the drill was not put to the test."""
        statuses = {key.status for key in self.keys}
        if "differs" in statuses:
            return EXIT_DIFFERS
        if "failed" in statuses:
            return EXIT_FAILED
        if "timeout" in statuses:
            return EXIT_OUT_OF_TIME
        if "match" not in statuses:
            return EXIT_UNKNOWN
        if self.drilled and not any(key.status == "match" and key.variant == DRILLED_VARIANT
                                    for key in self.keys):
            return EXIT_UNKNOWN
        return EXIT_GO

    def line(self) -> str:
        label = ", ".join(part for part in (self.name, self.uuid) if part)
        head = f"{self.device}" + (f" ({label})" if label else "")
        matched = [k for k in self.keys if k.status == "match"]
        statuses = {k.status for k in self.keys}
        code = self.code
        if code == EXIT_GO:
            return (f"{head}: go — {len(matched)} of {len(self.keys)} answer(s) as "
                    f"{self.against}: {', '.join(k.key for k in matched)}"
                    + self._unchecked())
        if code == EXIT_UNKNOWN and not statuses - {"unchecked"}:
            return (f"{head}: unknown — {self.note or 'nothing to compare with'}"
                    + self._unchecked())
        if code == EXIT_UNKNOWN and "match" in statuses:
            return (f"{head}: unknown — the drilled variant {DRILLED_VARIANT} was not "
                    f"compared ({len(matched)} of {len(self.keys)} answer(s) as "
                    f"{self.against})" + self._unchecked())
        bad = [k for k in self.keys if k.status in ("differs", "failed", "timeout")]
        verdict = "NO-GO" if code in (EXIT_DIFFERS, EXIT_FAILED) else "unknown"
        return (f"{head}: {verdict} — " + "; ".join(
            f"{k.key} {k.detail}" for k in bad) + f" ({len(matched)} of {len(self.keys)} "
            f"answer(s) as {self.against})" + self._unchecked())

    def _unchecked(self) -> str:
        unchecked = [k for k in self.keys if k.status == "unchecked"]
        return ("; not compared: " + ", ".join(f"{k.key} ({k.detail})" for k in unchecked)
                if unchecked else "")

    def to_json(self) -> dict[str, Any]:
        code = self.code
        return {"device": self.device, "name": self.name, "uuid": self.uuid,
                "model": self.model, "verdict": _verdict_word(code),
                "cause": _cause_word(code), "source": self.source, "against": self.against,
                "note": self.note, "seconds": round(self.seconds, 3),
                "answers": [key.to_json() for key in self.keys]}


_WORDS = {EXIT_DIFFERS: "differs", EXIT_FAILED: "failed", EXIT_OUT_OF_TIME: "out_of_time",
          EXIT_UNKNOWN: "unknown_environment", EXIT_REFUSED: "refused",
          EXIT_UNREACHABLE: "unreachable"}


def _cause_word(code: int) -> str | None:
    return _WORDS.get(code)


def _verdict_word(code: int) -> str:
    return "go" if code == EXIT_GO else ("no-go" if code in (EXIT_DIFFERS, EXIT_FAILED)
                                         else "unknown")


@dataclass
class CheckReport:
    """The whole check: each device's verdict, the node's cause and its exit code (with
    `fail_open`, an undetermined cause exits 0)."""

    devices: list[DeviceVerdict]
    fail_open: bool
    seconds: float = 0.0
    cause_code: int = EXIT_GO  # the node's cause before fail-open
    detail: str = ""  # a cause that is not a device's (unreachable, refused)
    env_key: str | None = None
    chosen_by: str | None = None
    drill: bool = False  # --fault-drill: fail-open never applies
    # What the benchmarks measured this plan to see, and its false alarms (`_proof`).
    proof: dict[str, Any] | None = None

    @property
    def exit_code(self) -> int:
        if self.opens:
            return EXIT_GO
        return self.cause_code

    @property
    def opens(self) -> bool:
        """Whether `--fail-open` turns the cause into a go."""
        return self.fail_open and not self.drill and self.cause_code in UNDETERMINED

    @property
    def verdict(self) -> str:
        if self.cause_code == EXIT_GO:
            return "go"
        if self.cause_code in (EXIT_DIFFERS, EXIT_FAILED):
            return "no-go"
        return "go (fail-open)" if self.opens else "unknown"

    def summary(self) -> str:
        if self.cause_code == EXIT_GO:
            return f"check: go (exit 0) in {self.seconds:.1f} s"
        why = CAUSES[self.cause_code] + (f": {self.detail}" if self.detail else "")
        return (f"check: {self.verdict}, exit {self.exit_code} ({why}"
                + (f"; exit {self.cause_code} without --fail-open" if self.exit_code
                   != self.cause_code else "") + f") in {self.seconds:.1f} s")

    def to_json(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "exit_code": self.exit_code,
                "cause": _cause_word(self.cause_code),
                "cause_exit_code": self.cause_code, "detail": self.detail or None,
                "fail": "open" if self.fail_open else "closed",
                "seconds": round(self.seconds, 3), "env_key": self.env_key,
                "chosen_by": self.chosen_by,
                "devices": [device.to_json() for device in self.devices],
                "proof": self.proof}


def worst(codes: Sequence[int]) -> int:
    return next((code for code in PRECEDENCE if code in codes), EXIT_GO)


def compare(expected: Mapping[str, Any], result: Mapping[str, Any] | None,
            key: KeyVerdict) -> KeyVerdict:
    """``result`` (this device's, from the run document) against the expected answer: its
    manifest, and tensor by tensor in execution order to name the first that differs."""
    if result is None:
        key.status, key.detail = "unchecked", "not run"
        return key
    status = result.get("status")
    if status == "failed":
        error = (result.get("error") or "").strip()
        timed_out = " timed out after " in error.splitlines()[0] if error else False
        key.status = "timeout" if timed_out else "failed"
        key.detail = ("was still running at the deadline (child killed)" if timed_out
                      else "failed: " + (error.splitlines()[0] if error else "no error text"))
        return key
    if status != "ok":
        key.status, key.detail = "unchecked", f"skipped: {result.get('reason', '')}"
        return key
    if result.get("workload_version") != expected.get("workload_version"):
        key.status = "unchecked"
        key.detail = (f"workload version {result.get('workload_version')} here, "
                      f"{expected.get('workload_version')} in the {expected['source']} answer")
        return key
    broken = [name for name in ("input_hash", "param_hash")
              if result.get(name) and expected.get(name) and result[name] != expected[name]]
    if broken:
        key.status = "differs"
        key.detail = (f"computes from other {' and '.join(broken)} bytes than the "
                      f"{expected['source']}'s: broken inputs on this node")
        return key
    tensors = sorted(result.get("tensors") or [], key=lambda t: t.get("order", 0))
    if manifest_hash(tensors) == expected["manifest_hash"]:
        key.status, key.detail = "match", ""
        return key
    mine = {t["name"]: t["hash"] for t in tensors}
    key.status = "differs"
    for name, digest in expected["tensors"]:
        if name not in mine:
            key.detail = f"has no tensor {name}"
            key.first_differing = name
            return key
        if not mine[name].startswith(digest):
            key.first_differing = name
            key.detail = f"differs from the {expected['source']} answer from tensor {name} on"
            return key
    extra = sorted(set(mine) - {name for name, _digest in expected["tensors"]})
    key.detail = ("has tensors the expected answer lacks: " + ", ".join(extra[:5]) if extra
                  else "differs from the expected answer (tensor order)")
    return key
