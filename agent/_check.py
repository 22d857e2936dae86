"""`numparity-agent check` (design §2.12): a go/no-go for a scheduler, in seconds.

Before a job starts on a node, `check` asks the server, in one request, which answers
this node's devices must give (`GET /api/v1/agent/check`: the pin in force for each
device model on this environment, else the fleet's majority there; a few workloads the
server chose — pinned, split somewhere in the fleet, recording layers — or the ones
named), computes them on every device at once (each device its own variant children),
compares each result's tensors with the expected hashes and says, one line per device,
go or no-go and why. It never takes longer than its budget (`max_seconds`): each step
gets only the time left, and a child still running at the deadline is killed.

It writes nothing to the spool and takes no lock: it can run beside `run`.

This module does not import torch.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import httpx

from numparity_agent import _suite, _variants
from numparity_agent._answer import ServerAnswer, answer_of, no_answer, server_message
from numparity_agent._knobs import numeric_env_vars
from numparity_agent._log import log
from numparity_agent._upload import manifest_hash

CHECK_PATH = "/api/v1/agent/check"
DEFAULT_MAX_SECONDS = 60.0
# Kept back from the budget for comparing, printing and the interpreter's exit, so the
# whole command ends within it (the budget counts from the process's start).
RESERVE_S = 1.0
# A variant's child is not started with less than this left: torch's import alone takes
# about as long, so it could not finish.
MIN_CHILD_S = 2.0
# Until the environment's child has been timed, what a variant's child is assumed to cost.
DEFAULT_CHILD_S = 4.0

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
# Causes that say nothing about the devices: `--fail-open` lets the job start on them.
UNDETERMINED = frozenset({EXIT_OUT_OF_TIME, EXIT_UNKNOWN, EXIT_REFUSED, EXIT_UNREACHABLE})
CAUSES = {
    EXIT_DIFFERS: "a device differs from the pinned or fleet answer",
    EXIT_FAILED: "a device could not compute the check (crash, error)",
    EXIT_OUT_OF_TIME: "not finished within --max-seconds",
    EXIT_UNKNOWN: "unknown environment: no pin and no fleet answer to compare with",
    EXIT_REFUSED: "the server refused the token (401/403)",
    EXIT_UNREACHABLE: "the server was unreachable or could not answer",
}

CHECK_EXIT_CODES_HELP = """\
check exit codes:
  0  go: every device gives the pinned (or fleet) answers; also any cause
     below but 10 and 13 with --fail-open
  2  usage (a bad option, a device the node does not show)
  5  the server refused the token (401/403)
  10 no-go: a device's answer differs from the pin or the fleet
  11 unknown environment: neither a pin nor fleet answers to compare with
  12 the server was unreachable, busy or could not answer
  13 no-go: a device could not compute the check (its child crashed, an error)
  14 not finished within --max-seconds (default 60)
  when several apply: the first of 10, 13, 14, 11, 5, 12"""


def device_model(device: Mapping[str, Any]) -> str:
    """The server's device model (its `devices.model`, design §3.1): `cpu`, or the type,
    name and compute capability of an accelerator (`cuda/NVIDIA A100-SXM4-80GB/8.0`)."""
    if device.get("type") == "cpu":
        return "cpu"
    return "/".join(str(part) for part in (device.get("type"), device.get("name"),
                                           device.get("compute_capability")) if part)[:320]


def stack_of(environment: Mapping[str, Any]) -> dict[str, str]:
    """The environment's promoted attributes (the server's `environments` columns): what
    a pin of a software stack matches when the server does not know this env_key."""

    def section(value: Any) -> Mapping[str, Any]:
        return value if isinstance(value, dict) else {}

    gpus = environment.get("gpus")
    gpu = section(gpus[0]) if isinstance(gpus, list) and gpus else {}
    torch, cpu = section(environment.get("torch")), section(environment.get("cpu"))
    values = {"gpu_name": gpu.get("name"), "compute_capability": gpu.get("compute_capability"),
              "driver": gpu.get("driver"), "cuda": torch.get("cuda"),
              "cudnn": torch.get("cudnn"), "torch": torch.get("version"),
              "cpu_capability": cpu.get("capability"), "cpu_model": cpu.get("model")}
    return {name: str(value)[:255] for name, value in values.items() if value is not None}


# ---- verdicts ------------------------------------------------------------------------


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

    @property
    def code(self) -> int:
        """The cause this device gives (0: go)."""
        statuses = {key.status for key in self.keys}
        if "differs" in statuses:
            return EXIT_DIFFERS
        if "failed" in statuses:
            return EXIT_FAILED
        if "timeout" in statuses:
            return EXIT_OUT_OF_TIME
        if "match" not in statuses:
            return EXIT_UNKNOWN
        return EXIT_GO

    def line(self) -> str:
        label = ", ".join(part for part in (self.name, self.uuid) if part)
        head = f"{self.device}" + (f" ({label})" if label else "")
        matched = [k for k in self.keys if k.status == "match"]
        code = self.code
        if code == EXIT_GO:
            return (f"{head}: go — {len(matched)} of {len(self.keys)} answer(s) as "
                    f"{self.against}: {', '.join(k.key for k in matched)}"
                    + self._unchecked())
        if code == EXIT_UNKNOWN and not self.keys:
            return f"{head}: unknown — {self.note or 'nothing to compare with'}"
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

    @property
    def exit_code(self) -> int:
        if self.fail_open and self.cause_code in UNDETERMINED:
            return EXIT_GO
        return self.cause_code

    @property
    def verdict(self) -> str:
        if self.cause_code == EXIT_GO:
            return "go"
        if self.cause_code in (EXIT_DIFFERS, EXIT_FAILED):
            return "no-go"
        return "go (fail-open)" if self.fail_open else "unknown"

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
                "devices": [device.to_json() for device in self.devices]}


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


# ---- the steps -----------------------------------------------------------------------


def process_age() -> float | None:
    """Seconds since this process started (Linux: /proc), so that the budget also counts
    the interpreter's start and imports; None where it cannot be read."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            # The command name (field 2) may hold spaces: the fields after it follow ")".
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime", encoding="ascii") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


# A process older than this when `check` begins was not started for it (a test, a program
# calling `main`): its budget counts from `main` instead of the process's start.
STARTUP_LIMIT_S = 15.0


def budget_start(main_started: float) -> float:
    """When the budget began: the process's start (its interpreter and imports count),
    unless the process was running long before `main` was called."""
    age = process_age()
    if age is None or age > STARTUP_LIMIT_S:
        return main_started
    return min(main_started, time.monotonic() - age)


class Deadline:
    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic,
                 started: float | None = None) -> None:
        self.clock = clock
        self.started = clock() if started is None else started
        self.at = self.started + max(0.0, seconds - RESERVE_S)

    def left(self) -> float:
        return max(0.0, self.at - self.clock())

    def elapsed(self) -> float:
        return self.clock() - self.started


# The watchdog fires this long before the budget ends: its own work (killing children,
# one line, the exit) fits in it.
WATCHDOG_MARGIN_S = 0.2


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux: /proc), and theirs, deepest first."""
    found: list[int] = []
    try:
        entries = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return found
    parents: dict[int, list[int]] = {}
    for name in entries:
        try:
            with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        parents.setdefault(ppid, []).append(int(name))

    def walk(parent: int) -> None:
        for child in parents.get(parent, []):
            walk(child)
            found.append(child)

    walk(pid)
    return found


class Watchdog:
    """The budget's backstop: should a step overrun its share (a machine so loaded that a
    killed child takes seconds to go), at the budget's end it kills this process's
    children, writes the out-of-time verdict and exits."""

    def __init__(self, deadline: Deadline, seconds: float,
                 finish: Callable[[float], int]) -> None:
        self._finish = finish
        delay = max(0.0, deadline.started + seconds - WATCHDOG_MARGIN_S - deadline.clock())
        self._timer = threading.Timer(delay, self._fire)
        self._timer.daemon = True
        self._deadline = deadline

    def __enter__(self) -> Watchdog:
        self._timer.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._timer.cancel()

    def _fire(self) -> None:
        for child in _children(os.getpid()):
            try:
                os.kill(child, signal.SIGKILL)
            except OSError:
                pass
        code = self._finish(self._deadline.elapsed())
        os._exit(code)


def fetch_plan(client: httpx.Client, server: str, token: str | None, *, suite: str,
               env_key: str, models: Sequence[str], stack: Mapping[str, str],
               workloads: Sequence[str], variants: Sequence[str], budget_s: float,
               child_s: float, timeout: float) -> tuple[ServerAnswer, dict[str, Any] | None]:
    """One request: the answers the server expects of each device model."""
    query: list[tuple[str, Any]] = [("suite", suite), ("env_key", env_key),
                                    *(("model", model) for model in models),
                                    *(("workload", w) for w in workloads),
                                    *(("variant", v) for v in variants),
                                    ("budget_s", f"{max(budget_s, 1.0):.0f}"),
                                    ("child_s", f"{child_s:.1f}"), *sorted(stack.items())]
    url = f"{server.rstrip('/')}{CHECK_PATH}?{urlencode(query)}"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        response = client.get(url, headers=headers, timeout=timeout)
    except httpx.HTTPError as exc:
        return no_answer(server.rstrip("/") + CHECK_PATH, exc), None
    answer = answer_of(response)
    if not answer.ok:
        return answer, None
    try:
        plan = response.json()
    except ValueError:
        return ServerAnswer(response.status_code, "the answer is not JSON"), None
    return answer, plan if isinstance(plan, dict) else None


def _against(device: Mapping[str, Any]) -> str:
    pin = device.get("pin")
    if device.get("source") == "pin" and isinstance(pin, dict):
        return (f"pinned (pin {pin.get('id')} v{pin.get('version')}: {pin.get('scope_text')}, "
                f"by {pin.get('pinned_by')})")
    return "the fleet's majority on this environment"


def check_device(device: Mapping[str, Any], expected: Sequence[Mapping[str, Any]], *,
                 deadline: Deadline, suite: str, node_env_vars: dict[str, str],
                 drill: bool) -> list[KeyVerdict]:
    """Compute the expected answers' workloads on one device, a child per variant (strict
    first), each given only the time left; compare each result."""
    slot = device["device"]
    by_variant: dict[str, list[Mapping[str, Any]]] = {}
    for answer in expected:
        by_variant.setdefault(answer["variant"], []).append(answer)
    order = sorted(by_variant, key=lambda v: (v != _variants.FAULT_DRILL_VARIANT, v))
    verdicts: list[KeyVerdict] = []
    for variant in order:
        answers = by_variant[variant]
        keys = [KeyVerdict(a["workload"], variant, a["source"]) for a in answers]
        left = deadline.left()
        if left < MIN_CHILD_S:
            for key in keys:
                key.status, key.detail = "timeout", "not started: the budget was spent"
            verdicts.extend(keys)
            continue
        workloads = [a["workload"] for a in answers]
        log(f"check: {slot} variant {variant}: {', '.join(workloads)}")
        _env, results = _suite.run_variant(
            variant, workloads=workloads, device=slot, repeats=1, timeout=left,
            node_env_vars=node_env_vars, suite=suite,
            fault_drill=drill and variant == _variants.FAULT_DRILL_VARIANT)
        by_workload = {r["workload"]: r for r in results}
        verdicts.extend(compare(answer, by_workload.get(answer["workload"]), key)
                        for answer, key in zip(answers, keys, strict=True))
    return verdicts


def run_check(*, client: httpx.Client, server: str, token: str | None,
              devices: Sequence[dict[str, Any]], environment: Mapping[str, Any],
              deadline: Deadline, child_s: float, suite: str, workloads: Sequence[str],
              variants: Sequence[str], fail_open: bool, drill_at: str | None,
              upload_timeout: float) -> CheckReport:
    """Ask the server, compute on every device at once, compare: the report."""
    models = list(dict.fromkeys(device_model(d) for d in devices))
    env_key = str(environment.get("env_key") or "")
    report = CheckReport(devices=[], fail_open=fail_open, env_key=env_key or None)
    answer, plan = fetch_plan(
        client, server, token, suite=suite, env_key=env_key, models=models,
        stack=stack_of(environment), workloads=workloads, variants=variants,
        budget_s=deadline.left(), child_s=child_s,
        timeout=max(0.1, min(upload_timeout, deadline.left())))
    if plan is None:
        report.cause_code = EXIT_REFUSED if answer.refused else EXIT_UNREACHABLE
        report.detail = server_message(answer.detail) if answer.status else answer.detail
        return report
    report.chosen_by = plan.get("chosen_by")
    planned = {entry["model"]: entry for entry in plan.get("devices") or []
               if isinstance(entry, dict) and "model" in entry}
    verdicts = []
    for device in devices:
        entry = planned.get(device_model(device), {})
        verdicts.append(DeviceVerdict(
            device=device["device"], name=device.get("name"), uuid=device.get("uuid"),
            model=device_model(device), source=entry.get("source", "none"),
            against=_against(entry), note=entry.get("note")))
    node_env_vars = numeric_env_vars()

    def one(index: int) -> list[KeyVerdict]:
        device = devices[index]
        expected = planned.get(device_model(device), {}).get("checks") or []
        started = time.monotonic()
        try:
            return check_device(device, expected, deadline=deadline, suite=suite,
                                node_env_vars=node_env_vars,
                                drill=drill_at == device["device"])
        finally:
            verdicts[index].seconds = time.monotonic() - started

    # Every device at once: each GPU runs its own children, so a node's check takes one
    # device's time, not eight.
    with ThreadPoolExecutor(max_workers=max(1, len(devices))) as pool:
        for verdict, keys in zip(verdicts, pool.map(one, range(len(devices))), strict=True):
            verdict.keys = keys
    report.devices = verdicts
    report.cause_code = worst([verdict.code for verdict in verdicts])
    return report


def list_node(selection: str, deadline: Deadline) -> tuple[list[dict[str, Any]],
                                                            dict[str, Any], float]:
    """(the devices, the environment, the seconds the environment's child took) — listed
    at the same time, each in a child of its own. Raises _suite.UsageError,
    _suite.DeviceListError, or RuntimeError (the environment could not be read)."""
    def timed_environment() -> tuple[dict[str, Any], float]:
        started = time.monotonic()
        environment = _suite._environment_child(max(0.1, deadline.left()))
        return environment, time.monotonic() - started

    with ThreadPoolExecutor(max_workers=2) as pool:
        environment = pool.submit(timed_environment)
        devices = pool.submit(_suite.select_devices, selection,
                              timeout=max(0.1, deadline.left()))
        found = devices.result()
        captured, seconds = environment.result()
    return found, captured, seconds
