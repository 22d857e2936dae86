"""Run the suite: every device at once, one child process per variant (group) after
another on each, results gathered into a run document.

Each variant runs in its own process (design §2.3): knobs such as
CUBLAS_WORKSPACE_CONFIG must be set before CUDA starts, and a crash or a hang in one
variant must not lose the others; a GPU that crashes or hangs its children fails its
own results only. The processes are forked from the run's fork server (`_forkserver`:
torch imported once) where their environment allows, else fresh interpreters. This
module does not import torch.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from numparity_agent import _compile, _devices, _variants, _workloads
from numparity_agent._document import build_document, utc_now
from numparity_agent._drill_spec import TENSOR_DRILL, DrillSpecError, drill_text, parse_drill
from numparity_agent._forkserver import ForkedChild, ForkServer
from numparity_agent._knobs import numeric_env_vars
from numparity_agent._log import log
from numparity_agent._telemetry import read_in_child

DEFAULT_TIMEOUT_S = 900.0
DEFAULT_REPEATS = 2
PROGRESS_POLL_S = 0.5
# on_progress(finished, total, what): results finished so far, of how many, and what
# runs now ("cnn/strict"); called often (every PROGRESS_POLL_S) so a display can tick.
Progress = Callable[[int, int, str], None]


class UsageError(ValueError):
    """A bad request from the caller (unknown workload or variant, bad repeats)."""


def check_suite(suite: str) -> None:
    if suite not in _workloads.SUITES:
        raise UsageError(
            f"unknown suite {suite}; valid: {', '.join(_workloads.suite_names())}")


def validate(
    workloads: Sequence[str], variants: Sequence[str], repeats: int, *,
    drill: bool | str = False, suite: str = _workloads.SUITE,
) -> None:
    check_suite(suite)
    try:
        parse_drill(drill)
    except DrillSpecError as exc:
        raise UsageError(str(exc)) from None
    bad_w = [w for w in workloads if not _workloads.is_known(w, suite)]
    if bad_w:
        raise UsageError(
            f"unknown workload(s) {', '.join(bad_w)} in suite {suite}; valid: "
            f"{', '.join(_workloads.builtin_names(suite))} or module:factory"
        )
    bad_v = [v for v in variants if v not in _variants.VARIANTS]
    if bad_v:
        raise UsageError(
            f"unknown variant(s) {', '.join(bad_v)}; valid: {', '.join(_variants.names())}"
        )
    if repeats < 1:
        raise UsageError("repeats must be at least 1")
    if drill and _variants.FAULT_DRILL_VARIANT not in variants:
        raise UsageError(
            f"--fault-drill corrupts the {_variants.FAULT_DRILL_VARIANT} variant; "
            f"add {_variants.FAULT_DRILL_VARIANT} to --variants"
        )


def default_variants(suite: str = _workloads.SUITE) -> list[str]:
    """The variants a run of `suite` makes when none are named: all, but those the suite
    leaves out unless asked for (`_workloads.NOT_BY_DEFAULT`) and the opt-in ones
    (`_variants.OPT_IN`: `compiled`)."""
    skipped = _workloads.NOT_BY_DEFAULT.get(suite, frozenset()) | _variants.OPT_IN
    return [v for v in _variants.names() if v not in skipped]


def _child_failure(proc: subprocess.CompletedProcess[str] | None, reason: str) -> str:
    tail = ""
    if proc is not None and proc.stderr:
        tail = "\n" + proc.stderr[-2000:]
    return reason + tail


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"child killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"child killed by signal {-code}"
    return f"child exited with code {code}"


@dataclass
class ChildRun:
    """What the child processes of some variants on one device gave: the environment
    (None when none captured one), the results in the order of the variants, and one
    timeline entry per child process (design §2.7 `timeline`)."""

    environment: dict[str, Any] | None
    results: list[dict[str, Any]]
    timeline: list[dict[str, Any]] = field(default_factory=list)


def run_variant(
    variant: str,
    *,
    workloads: Sequence[str],
    device: str,
    repeats: int,
    timeout: float,
    node_env_vars: dict[str, str],
    fault_drill: bool | str = False,
    on_progress: Callable[[int], None] | None = None,
    values_dir: Path | None = None,
    trace_ops: bool = False,
    study_budget_s: float | None = None,
    suite: str = _workloads.SUITE,
    compile_cache: Path | None = None,
) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """(environment or None, results) of one variant's child process; with
    `fault_drill` the child flips one bit in each workload (design §2.6; an `op:SPEC`
    text: inside the computation, `_inject`), with
    `trace_ops` it records each workload's ops (§2.10).
    `on_progress(finished)` is called while the child runs with how many of its
    workloads it has finished."""
    run = run_variants([variant], workloads=workloads, device=device, repeats=repeats,
                       timeout=timeout, node_env_vars=node_env_vars,
                       fault_drill=fault_drill, on_progress=on_progress,
                       values_dir=values_dir, trace_ops=trace_ops,
                       study_budget_s=study_budget_s, suite=suite,
                       compile_cache=compile_cache)
    return run.environment, run.results


def run_variants(
    variants: Sequence[str],
    *,
    workloads: Sequence[str],
    device: str,
    repeats: int,
    timeout: float,
    node_env_vars: dict[str, str],
    fault_drill: bool | str = False,
    on_progress: Callable[[int], None] | None = None,
    values_dir: Path | None = None,
    trace_ops: bool = False,
    study_budget_s: float | None = None,
    suite: str = _workloads.SUITE,
    environment: bool = True,
    visible: str | None = None,
    fork_server: ForkServer | None = None,
    compile_cache: Path | None = None,
) -> ChildRun:
    """`variants` (one `_variants.process_groups` group) in one child process, each
    with `timeout` seconds (from when it starts): the variants a crash or a timeout
    leaves unstarted run in a fresh child; the one it hit fails with the reason.
    `environment`: the child captures the environment document (the first child of a
    run does; the others need not). `on_progress(finished)` counts workloads over all
    of `variants`."""
    pending = list(variants)
    run = ChildRun(None, [])
    done = 0
    while pending:
        def progress(finished: int, done: int = done) -> None:
            if on_progress is not None:
                on_progress(done + finished)

        part = _run_child(pending, workloads=workloads, device=device, repeats=repeats,
                          timeout=timeout, node_env_vars=node_env_vars,
                          fault_drill=fault_drill, on_progress=progress,
                          values_dir=values_dir, trace_ops=trace_ops,
                          study_budget_s=study_budget_s, suite=suite,
                          environment=environment and run.environment is None,
                          visible=visible, fork_server=fork_server,
                          compile_cache=compile_cache)
        run.environment = run.environment or part.environment
        run.results.extend(part.results)
        run.timeline.extend(part.timeline)
        finished = {r["variant"] for r in part.results}
        done += len(finished) * len(workloads)
        left = [v for v in pending if v not in finished]
        if left == pending:  # nothing came back: never loop on a child that cannot start
            break
        pending = left
    return run


def _run_child(
    variants: list[str],
    *,
    workloads: Sequence[str],
    device: str,
    repeats: int,
    timeout: float,
    node_env_vars: dict[str, str],
    fault_drill: bool | str,
    on_progress: Callable[[int], None],
    values_dir: Path | None,
    trace_ops: bool,
    suite: str,
    environment: bool,
    study_budget_s: float | None = None,
    visible: str | None = None,
    fork_server: ForkServer | None = None,
    compile_cache: Path | None = None,
) -> ChildRun:
    """One child for `variants`: its results for the variants it finished, failed
    results for the one a crash or a timeout hit, nothing for those it left (the
    caller starts another child for them). `visible`: the child sees only this device
    (its CUDA_VISIBLE_DEVICES) and computes on its cuda:0. `fork_server`: the child is
    forked from it where its environment allows (`_start`), else a fresh interpreter.
    `compile_cache`: Inductor's cache folder for a compiling variant
    (`_compile.cache_environ`)."""
    spec = {
        "variants": variants,
        "suite": suite,
        "workloads": list(workloads),
        "device": device,
        "repeats": repeats,
        "node_env_vars": node_env_vars,
        "fault_drill": fault_drill,
        "trace_ops": trace_ops,
        "study_budget_s": study_budget_s,
        "values_dir": str(values_dir) if values_dir is not None else None,
        "environment": environment,
    }
    # The group's variants have the same child environment (`process_groups`).
    first = _variants.get(variants[0])
    env = first.child_env(dict(os.environ))
    if first.compiles:
        env = _compile.cache_environ(env, compile_cache)
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
        spec["torch_device"] = "cuda:0"
    per_variant = max(len(workloads), 1)
    with tempfile.TemporaryDirectory(prefix="numparity-") as tmp:
        spec_path = os.path.join(tmp, "spec.json")
        out_path = os.path.join(tmp, "out.json")
        spec["progress"] = os.path.join(tmp, "progress")
        spawned = time.time()
        spec["spawned_at"] = spawned
        with open(spec_path, "w", encoding="utf-8") as f:
            json.dump(spec, f)
        proc = None
        try:
            proc = _run_watched("numparity_agent._child", [spec_path, out_path], env,
                                timeout, str(spec["progress"]), on_progress, per_variant,
                                tmp=tmp, fork_server=fork_server)
        except subprocess.TimeoutExpired as exc:
            error = f"variant {{variant}} timed out after {timeout:g} s (child killed)"
            stderr = exc.stderr
        else:
            if proc.returncode == 0 and os.path.exists(out_path):
                with open(out_path, encoding="utf-8") as f:
                    output = json.load(f)
                return ChildRun(output.get("environment"), output["results"],
                                [_timeline_entry(output, device, variants, spawned)])
            error = _child_failure(proc, _describe_exit(proc.returncode))
            stderr = None
        # What the child finished before it died, and the variant it died in.
        parts = _parts(out_path, len(variants))
        early = _read_part(f"{out_path}.environment")  # written before any variant ran
    found_env = next((p.get("environment") for p in [early, *parts] if p.get("environment")),
                     None)
    results = [r for p in parts for r in p["results"]]
    hit = variants[len(parts)] if len(parts) < len(variants) else None
    if hit is not None:
        reason = error.replace("{variant}", hit)
        if stderr:
            reason += "\n" + str(stderr)[-2000:]
        results += [{"suite": suite, "workload": w, "workload_version": None, "variant": hit,
                     "device": device, "status": "failed", "error": reason}
                    for w in workloads]
    return ChildRun(found_env, results, [{
        "device": device, "variants": variants[:len(parts) + 1],
        "wall_s": round(time.time() - spawned, 3), "phases": {}}])


def _timeline_entry(output: dict[str, Any], device: str, variants: list[str],
                    spawned: float) -> dict[str, Any]:
    """The document's `timeline` entry of a child that answered: its own phases, `write`
    (from its answer to the parent having read it) and `other` (what no phase counts:
    applying knobs, loading workloads, the parent's bookkeeping)."""
    now = time.time()
    phases = dict(output.get("timeline", {}))
    finished = output.get("finished_at")
    if isinstance(finished, int | float):
        phases["write_s"] = round(max(now - finished, 0.0), 6)
    wall = now - spawned
    phases["other_s"] = round(max(wall - sum(float(v) for v in phases.values()), 0.0), 6)
    ran = [v for v in variants if v not in output.get("not_run", [])]
    return {"device": device, "variants": ran, "wall_s": round(wall, 3), "phases": phases}


def _parts(out_path: str, count: int) -> list[dict[str, Any]]:
    """The per-variant answers (`OUT.<i>`) a child wrote before it stopped, in order."""
    parts = []
    for position in range(count):
        part = _read_part(f"{out_path}.{position}")
        if not part:
            break
        parts.append(part)
    return parts


def _read_part(path: str) -> dict[str, Any]:
    """A part a child wrote (`OUT.<i>`, `OUT.environment`); {} when there is none."""
    try:
        with open(path, encoding="utf-8") as f:
            part: dict[str, Any] = json.load(f)
    except (OSError, ValueError):
        return {}
    return part


class _Fresh:
    """A child in a fresh interpreter (`python -m module`), as ForkedChild's interface."""

    def __init__(self, module: str, argv: list[str], env: dict[str, str], stdout: str,
                 stderr: str) -> None:
        with open(stdout, "wb") as out, open(stderr, "wb") as err:
            self._proc = subprocess.Popen([sys.executable, "-m", module, *argv], env=env,
                                          stdin=subprocess.DEVNULL, stdout=out, stderr=err)

    def wait(self, timeout: float | None = None) -> int | None:
        try:
            return self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        self._proc.kill()
        self._proc.wait()


def _start(module: str, argv: list[str], env: dict[str, str], tmp: str,
           fork_server: ForkServer | None) -> _Fresh | ForkedChild:
    """`python -m module argv` with `env`, its output to files in `tmp`: forked from
    `fork_server` where it takes `env` (`ForkServer.refuses`), else a fresh interpreter."""
    stdout, stderr = os.path.join(tmp, "child.stdout"), os.path.join(tmp, "child.stderr")
    if fork_server is not None:
        refusal = fork_server.refuses(env)
        if refusal is None:
            try:
                return fork_server.spawn(module, argv, env=env, stdout=stdout, stderr=stderr)
            except OSError as exc:
                refusal = str(exc)
        fork_server.refused(refusal)
    return _Fresh(module, argv, env, stdout, stderr)


def _output(tmp: str, name: str) -> str:
    try:
        with open(os.path.join(tmp, f"child.{name}"), encoding="utf-8",
                  errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _run_watched(
    module: str, argv: list[str], env: dict[str, str], timeout: float, progress_path: str,
    on_progress: Callable[[int], None], per_variant: int = 0, *, tmp: str,
    fork_server: ForkServer | None = None,
) -> subprocess.CompletedProcess[str]:
    """`python -m module argv` (see `_start`) with a timeout, reporting the child's
    progress file meanwhile; with `per_variant` (workloads per variant) the timeout
    counts from the start of the variant the child is on."""
    cmd = [sys.executable, "-m", module, *argv]
    child = _start(module, argv, env, tmp, fork_server)
    started = time.monotonic()
    variant_started, finished_variants = started, 0
    while True:
        deadline = variant_started + timeout
        code = child.wait(max(0.0, min(PROGRESS_POLL_S, deadline - time.monotonic())))
        if code is not None:
            break
        finished = _lines(progress_path)
        if per_variant and finished // per_variant > finished_variants:
            finished_variants = finished // per_variant
            variant_started = time.monotonic()
            continue
        if time.monotonic() >= deadline:
            child.kill()
            child.wait()
            raise subprocess.TimeoutExpired(cmd, timeout, stderr=_output(tmp, "stderr"))
        on_progress(finished)
    return subprocess.CompletedProcess(cmd, code, _output(tmp, "stdout"),
                                       _output(tmp, "stderr"))


def _lines(path: str) -> int:
    try:
        with open(path, encoding="utf-8") as f:
            return sum(1 for line in f if line.endswith("\n"))
    except OSError:
        return 0


def _environment_child(timeout: float, fork_server: ForkServer | None = None
                       ) -> dict[str, Any]:
    """The environment from a child of its own (`numparity-agent env`: a fresh
    interpreter, or forked from `fork_server`), when no variant child delivered one."""
    with tempfile.TemporaryDirectory(prefix="numparity-") as tmp:
        child = _start("numparity_agent", ["env"], dict(os.environ), tmp, fork_server)
        code = child.wait(timeout)
        if code is None:
            child.kill()
            child.wait()
            raise subprocess.TimeoutExpired([sys.executable, "-m", "numparity_agent", "env"],
                                            timeout, stderr=_output(tmp, "stderr"))
        if code != 0:
            raise RuntimeError(_describe_exit(code) + "\n" + _output(tmp, "stderr")[-2000:])
        environment: dict[str, Any] = json.loads(_output(tmp, "stdout"))
    return environment


def _node_gpus(timeout: float, fork_server: ForkServer | None = None) -> list[str] | None:
    """NVML's UUIDs of the node's GPUs (`_devices.node_gpus`, in a child: NVML can hang
    on a wedged GPU); None when NVML cannot say."""
    with tempfile.TemporaryDirectory(prefix="numparity-") as tmp:
        child = _start("numparity_agent._devices", ["--node-gpus"], dict(os.environ), tmp,
                       fork_server)
        code = child.wait(timeout)
        if code is None:
            child.kill()
            child.wait()
            return None
        try:
            found = json.loads(_output(tmp, "stdout")) if code == 0 else None
        except ValueError:
            return None
    if not isinstance(found, list):
        return None
    return [str(uuid) for uuid in found]


@dataclass
class _DeviceRun:
    """What one device's children gave: its results, timeline, its `devices` entry,
    and the environment when its first child captured it."""

    environment: dict[str, Any] | None = None
    results: list[dict[str, Any]] = field(default_factory=list)
    timeline: list[dict[str, Any]] = field(default_factory=list)
    entry: dict[str, Any] = field(default_factory=dict)


class DeviceListError(RuntimeError):
    """The child that lists the node's devices crashed or timed out."""


def list_devices(timeout: float, fork_server: ForkServer | None = None
                 ) -> list[dict[str, Any]]:
    """Every visible device (`_devices.visible_devices`), from a child process (a fresh
    interpreter, or forked from `fork_server`): CUDA and NVML can hang on a wedged GPU,
    and the agent's own process stays without torch."""
    with tempfile.TemporaryDirectory(prefix="numparity-") as tmp:
        child = _start("numparity_agent._devices", [], dict(os.environ), tmp, fork_server)
        code = child.wait(timeout)
        if code is None:
            child.kill()
            child.wait()
            raise DeviceListError(f"listing the devices timed out after {timeout:g} s")
        if code != 0:
            stderr = _output(tmp, "stderr")
            raise DeviceListError(_describe_exit(code) + ("\n" + stderr[-2000:] if stderr
                                                          else ""))
        devices: list[dict[str, Any]] = json.loads(_output(tmp, "stdout"))
    return devices


def select_devices(selection: str, *, timeout: float = DEFAULT_TIMEOUT_S,
                   fork_server: ForkServer | None = None) -> list[dict[str, Any]]:
    """The devices `selection` names (`cuda:0,cuda:3`, `cpu`, `all`: every visible CUDA
    device, else the CPU). UsageError when it names one this node does not show (the
    message lists those it does); DeviceListError when they cannot be listed."""
    try:
        items = _devices.parse_selection(selection)
        wanted = _devices.needs_cuda(items) and _devices.gpu_driver_present()
        visible = list_devices(timeout, fork_server) if wanted else []
        return _devices.select(items, visible)
    except _devices.DeviceError as exc:
        raise UsageError(str(exc)) from None


def drill_slot(devices: Sequence[dict[str, Any]], drill_device: str | None) -> str:
    """The device `--fault-drill` corrupts: `drill_device`, one of `devices`, else the
    first of them."""
    slots = [d["device"] for d in devices]
    if drill_device is None:
        return slots[0]
    try:
        items = _devices.parse_selection(drill_device)
    except _devices.DeviceError as exc:
        raise UsageError(f"--drill-device: {exc}") from None
    if len(items) != 1 or items[0] not in slots:
        raise UsageError(f"--drill-device {drill_device} is not one device of this run; "
                         f"its devices: {', '.join(slots)}")
    return items[0]


def isolated_visible(device: dict[str, Any], workloads: Sequence[str],
                     environ: dict[str, str] | None = None) -> str | None:
    """What CUDA_VISIBLE_DEVICES shows a CUDA device's children only that device with:
    its UUID (a MIG instance's `MIG-…` too: CUDA shows one MIG instance per process),
    else its item of the parent's own CUDA_VISIBLE_DEVICES (a scheduler's `1,2`), else
    its index. None for the CPU, and for a device that runs a node-wide workload (the
    collectives span every GPU). A child that sees one device creates no context on
    another (`torch.cuda.synchronize()` without a device would on cuda:0)."""
    if device.get("type") != "cuda" or any(w in _workloads.NODE_WIDE for w in workloads):
        return None
    if device.get("uuid"):
        return str(device["uuid"])
    index = device.get("index")
    if not isinstance(index, int):
        return None
    listed = (os.environ if environ is None else environ).get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return str(index)
    items = [item.strip() for item in listed.split(",") if item.strip()]
    return items[index] if index < len(items) else None


def device_plan(
    devices: Sequence[dict[str, Any]], variants: Sequence[str]
) -> list[tuple[dict[str, Any], list[str]]]:
    """Each device with the variants it runs, in order: every variant on every device,
    except the CPU-only ones (the float64 reference), which run once, on the CPU, added
    at the end when the run has no CPU of its own."""
    once = [v for v in variants if _variants.get(v).cpu_only]
    plan = []
    for device in devices:
        runs = list(variants) if device["type"] == "cpu" else [
            v for v in variants if v not in once]
        if runs:
            plan.append((dict(device), runs))
    if once and not any(d["type"] == "cpu" for d in devices):
        plan.append((_devices.cpu_device(), once))
    return plan


def device_workloads(plan: Sequence[tuple[dict[str, Any], list[str]]],
                     workloads: Sequence[str]) -> list[list[str]]:
    """The workloads each entry of `plan` runs: all of them, but the node-wide ones
    (`_workloads.NODE_WIDE`: the collectives span every GPU of the node) only on the
    first device of each type — eight identical all-reduces on an 8-GPU node would
    measure the same thing eight times."""
    seen: set[str] = set()
    found = []
    for device, _runs in plan:
        first = device["type"] not in seen
        seen.add(device["type"])
        found.append([w for w in workloads if first or w not in _workloads.NODE_WIDE])
    return found


def _checks_said(checks: Any) -> str:
    """A result's checks on its log line: how many hold, and which do not."""
    if not isinstance(checks, dict) or not checks:
        return ""
    failing = [name for name, check in checks.items()
               if isinstance(check, dict) and check.get("equal") is False]
    said = f", checks: {len(checks) - len(failing)} of {len(checks)} hold"
    if failing:
        said += f" (not {', '.join(failing[:4])}{', …' if len(failing) > 4 else ''})"
    return said


def _log_results(log_line: Callable[[str], None], prefix: str,
                 results: list[dict[str, Any]]) -> None:
    for result in results:
        status = result["status"]
        detail = ""
        if status == "ok":
            detail = f" in {result['wall_s']:.3f} s"
            # One repeat compares nothing: a workload that repeats its own measurement
            # (the data pipeline) says what its checks say instead.
            if (result.get("repeats") or 0) >= 2:
                detail += f", repeats agree: {result['repeats_agree']}"
            detail += _checks_said(result.get("checks"))
            study = result.get("nondeterminism")
            if study:
                ops = study.get("ops") or []
                sources = study.get("sources") or []
                if ops:
                    detail += (f"; nondeterministic at {ops[0]['op']} in "
                               f"{ops[0]['module'] or 'the model'} ({ops[0]['phase']})")
                elif sources:
                    detail += (f"; the difference enters at {sources[0]['op']} in "
                               f"{sources[0]['module'] or 'the model'} from "
                               f"{sources[0]['source']}: recipe {sources[0]['recipe']}")
                else:
                    detail += f"; {study.get('note') or study.get('hint') or ''}"
            if "drill" in result:
                detail += "; " + drill_summary(result["drill"])
        elif status == "failed":
            detail = ": " + result["error"].strip().splitlines()[0]
        else:
            detail = ": " + result.get("reason", "")
        log_line(f"{prefix}variant {result['variant']}: {result['workload']} {status}{detail}")


def drill_summary(flip: dict[str, Any]) -> str:
    """A result's `drill` field in words, for the log line."""
    if flip.get("kind") == "op":
        if not flip.get("calls") or "op" not in flip:
            return (f"fault drill {flip.get('spec')}: no {flip.get('class')} op of it ran "
                    "here, nothing corrupted")
        where = "".join(f" in {kind} {flip[kind]}" for kind in ("rank", "worker")
                        if kind in flip)
        return (f"fault drill {flip['spec']}: bit(s) {flip['bits']} of {flip['op']} call "
                f"{flip['call']}[{flip['index']}]{where}: {flip['before']!r} -> "
                f"{flip['after']!r}")
    return (f"fault drill flipped bit {flip['bit']} of {flip['layer']}"
            f"[{flip['index']}]: {flip['before']!r} -> {flip['after']!r}")


def run_suite(
    *,
    workloads: Sequence[str] | None = None,
    variants: Sequence[str] | None = None,
    device: str | Sequence[dict[str, Any]] = _devices.ALL,
    repeats: int = DEFAULT_REPEATS,
    node: str | None = None,
    labels: dict[str, str] | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    log_line: Callable[[str], None] = log,
    drill: bool | str = False,
    drill_device: str | None = None,
    on_progress: Progress | None = None,
    values_dir: Path | None = None,
    trace_ops: bool = False,
    study_budget_s: float | None = None,
    suite: str = _workloads.SUITE,
    fork_server: bool | ForkServer = True,
    compile_cache: Path | None = None,
) -> dict[str, Any]:
    """Run `workloads` of `suite` under `variants` (by default its built-ins under
    `default_variants(suite)`) on each device: the run document. Large tensors' values
    are kept in `values_dir` when given (`_values`).

    `device` is a selection (see select_devices; default every visible CUDA device,
    else the CPU) or the devices select_devices gave for one. The devices run at once,
    each variant (group) of each in its own child, one after another; a CUDA device's
    children see only it (`isolated_visible`); the float64 reference runs once, on the
    CPU (device_plan). The document lists the devices with the seconds each
    took and its status: "failed" when every one of its results failed.

    With `drill` (`run --fault-drill`, design §2.6) the document is marked as a drill
    and, in the FAULT_DRILL_VARIANT on `drill_device` only (default: the first
    device), every workload that records layers has one bit of one activation
    flipped (an `op:SPEC` text: one op's output corrupted as it is computed, `_inject`);
    everything else runs as without it.
    `on_progress` follows the run workload by workload (see Progress). With
    `trace_ops` every variant records each workload's ops (design §2.10): the document
    carries the trace bodies in `traces`, each result the hash of its own.
    With `fork_server` the children are forked from one interpreter that imported torch
    once (`_forkserver`), where their environment allows; else each is a fresh one. A
    ForkServer given is used (and left running); True starts one for the run.
    `compile_cache`: Inductor's cache folder for the compiled variant (design §2.14).
    """
    check_suite(suite)
    workloads = list(workloads or _workloads.builtin_names(suite))
    variants = list(variants or default_variants(suite))
    validate(workloads, variants, repeats, drill=drill, suite=suite)
    # One per run: torch's import is paid once, by the server, not by every child.
    given = fork_server if isinstance(fork_server, ForkServer) else None
    server = given or (ForkServer() if fork_server else None)
    try:
        return _run_suite(
            workloads=workloads, variants=variants, device=device, repeats=repeats,
            node=node, labels=labels, timeout=timeout, log_line=log_line, drill=drill,
            drill_device=drill_device, on_progress=on_progress, values_dir=values_dir,
            trace_ops=trace_ops, study_budget_s=study_budget_s, suite=suite, server=server,
            compile_cache=compile_cache)
    finally:
        if server is not None:
            if given is None:
                server.close()
            for refusal in server.refusals:
                log_line(f"a child ran in a fresh interpreter: {refusal}")


def _run_suite(
    *, workloads: list[str], variants: list[str], device: str | Sequence[dict[str, Any]],
    repeats: int, node: str | None, labels: dict[str, str] | None, timeout: float,
    log_line: Callable[[str], None], drill: bool | str, drill_device: str | None,
    on_progress: Progress | None, values_dir: Path | None, trace_ops: bool,
    study_budget_s: float | None, suite: str, server: ForkServer | None,
    compile_cache: Path | None,
) -> dict[str, Any]:
    devices = (select_devices(device, timeout=timeout, fork_server=server)
               if isinstance(device, str) else device)
    drill_at = drill_slot(devices, drill_device) if drill else None
    plan = device_plan(devices, variants)
    several = len(plan) > 1
    if several:
        log_line("devices: " + "; ".join(
            f"{_devices.describe(d)}: {', '.join(runs)}" for d, runs in plan))
    if drill:
        what = "one bit flipped" if parse_drill(drill) == TENSOR_DRILL \
            else f"one op output corrupted ({drill_text(parse_drill(drill))})"
        log_line(
            f"fault drill: {what} per workload in {_variants.FAULT_DRILL_VARIANT} "
            f"on {drill_at}; the document is marked as a drill"
        )
    node_env_vars = numeric_env_vars()
    started_at = utc_now()
    return _run_devices(
        plan=plan, workloads=workloads, variants=variants, repeats=repeats, node=node,
        labels=labels, timeout=timeout, log_line=log_line, drill=drill,
        drill_at=drill_at, on_progress=on_progress, values_dir=values_dir,
        trace_ops=trace_ops, study_budget_s=study_budget_s, suite=suite,
        node_env_vars=node_env_vars, started_at=started_at, server=server,
        compile_cache=compile_cache)


def _run_devices(
    *, plan: list[tuple[dict[str, Any], list[str]]], workloads: list[str],
    variants: list[str], repeats: int, node: str | None, labels: dict[str, str] | None,
    timeout: float, log_line: Callable[[str], None], drill: bool | str, drill_at: str | None,
    on_progress: Progress | None, values_dir: Path | None, trace_ops: bool,
    study_budget_s: float | None, suite: str, node_env_vars: dict[str, str],
    started_at: str, server: ForkServer | None, compile_cache: Path | None,
) -> dict[str, Any]:
    """run_suite's run of its `plan`, every device at once."""
    several = len(plan) > 1
    # The GPUs' own readings at the start and the end (`_telemetry`; none without NVML).
    gpu_uuids = [d["uuid"] for d, _ in plan if d.get("type") == "cuda" and d.get("uuid")]
    telemetry_start = read_in_child(gpu_uuids)
    per_device = device_workloads(plan, workloads)
    total = sum(len(runs) * len(names) for (_, runs), names in zip(plan, per_device,
                                                                    strict=True))
    # The devices run at once, each in its own thread of children (a node's total is
    # about one device's, not N times it); what they report goes through one lock.
    lock = threading.Lock()
    finished: dict[int, int] = {}

    def say(line: str) -> None:
        with lock:
            log_line(line)

    isolated = [isolated_visible(entry, names)
                for (entry, _runs), names in zip(plan, per_device, strict=True)]
    # A child that sees one GPU would describe one GPU: where the first device's children
    # are isolated, the environment (every GPU this agent sees) comes from a child of its
    # own, beside the devices' (as `numparity-agent env` captures it).
    own_environment_child = bool(isolated) and isolated[0] is not None

    def run_device(position: int, entry: dict[str, Any], runs: list[str],
                   on_device: list[str]) -> _DeviceRun:
        slot = entry["device"]
        prefix = f"{slot} " if several else ""
        visible = isolated[position]
        device_started = time.monotonic()
        run = _DeviceRun()
        done_here = 0
        for group in _variants.process_groups(runs, dict(os.environ)):
            names = ", ".join(group)
            say(f"{prefix}variant{'s' if len(group) > 1 else ''} {names}: running "
                f"{', '.join(on_device)}" + ("" if several else f" on {slot}")
                + (" (one process)" if len(group) > 1 else ""))
            watch = None
            if on_progress is not None:
                def watch(count: int, group: list[str] = group, before: int = done_here,
                          prefix: str = prefix, on_device: list[str] = on_device) -> None:
                    variant = group[min(count // max(len(on_device), 1), len(group) - 1)]
                    now = on_device[min(count % max(len(on_device), 1), len(on_device) - 1)]
                    with lock:
                        finished[position] = before + count
                        on_progress(sum(finished.values()), total, f"{prefix}{now}/{variant}")

                watch(0)
            started = time.monotonic()
            child = run_variants(
                group,
                workloads=on_device,
                device=slot,
                repeats=repeats,
                timeout=timeout,
                node_env_vars=node_env_vars,
                fault_drill=(drill if drill_at == slot
                             and _variants.FAULT_DRILL_VARIANT in group else False),
                on_progress=watch,
                values_dir=values_dir,
                trace_ops=trace_ops, study_budget_s=study_budget_s,
                suite=suite,
                # The first device's first child captures the environment.
                environment=(position == 0 and not own_environment_child
                             and run.environment is None),
                visible=visible, fork_server=server,
                compile_cache=compile_cache,
            )
            run.environment = run.environment or child.environment
            run.timeline.extend(child.timeline)
            with lock:
                _log_results(log_line, prefix, child.results)
            run.results.extend(child.results)
            done_here += len(child.results)
            say(f"{prefix}variant{'s' if len(group) > 1 else ''} {names}: done in "
                f"{time.monotonic() - started:.1f} s")
            if on_progress is not None:
                with lock:
                    finished[position] = done_here
                    on_progress(sum(finished.values()), total, f"{prefix}{names} done")
        wall_s = time.monotonic() - device_started
        failed = all(r["status"] == "failed" for r in run.results)
        run.entry = {**entry, "wall_s": round(wall_s, 3), "status": "failed" if failed else "ok"}
        say(f"device {_devices.describe(entry)}: done in {wall_s:.1f} s"
            + (", every result failed" if failed else ""))
        return run

    with ThreadPoolExecutor(max_workers=len(plan) + 2,
                            thread_name_prefix="numparity-device") as pool:
        captured = (pool.submit(_environment_child, timeout, server)
                    if own_environment_child else None)
        # Which GPUs the node has, whatever this run was given (the server keeps them).
        listed = (pool.submit(_node_gpus, timeout, server)
                  if any(entry["type"] == "cuda" for entry, _runs in plan) else None)
        futures = [pool.submit(run_device, position, entry, runs, on_device)
                   for position, ((entry, runs), on_device)
                   in enumerate(zip(plan, per_device, strict=True))]
        device_runs = [future.result() for future in futures]
        node_gpus = listed.result() if listed is not None else None
        environment: dict[str, Any] | None = next(
            (r.environment for r in device_runs if r.environment), None)
        if captured is not None:
            try:
                environment = captured.result()
            except Exception as exc:  # noqa: BLE001 - captured again below
                log_line(f"environment capture failed, once: {exc}")
    results = [result for r in device_runs for result in r.results]
    entries = [r.entry for r in device_runs]
    telemetry_end = read_in_child(gpu_uuids)
    for entry in entries:
        readings = {when: found[entry.get("uuid")] for when, found
                    in (("start", telemetry_start), ("end", telemetry_end))
                    if entry.get("uuid") in found}
        if readings:
            entry["telemetry"] = readings
    timeline = [t for r in device_runs for t in r.timeline]
    if environment is None:
        try:
            environment = _environment_child(timeout, server)
        except Exception as exc:  # noqa: BLE001
            log_line(f"environment capture failed: {exc}")
            environment = {"env_key": None, "unknown": {"environment": str(exc)}}
    return build_document(
        node=node or socket.gethostname(),
        labels=labels or {},
        environment=environment,
        results=results,
        started_at=started_at,
        finished_at=utc_now(),
        drill=bool(drill),
        drill_device=drill_at,
        drill_spec=drill_text(parse_drill(drill)) if drill else None,
        devices=entries,
        results_order=variants,
        timeline=timeline,
        node_gpus=node_gpus,
    )
