"""Run the suite: device after device, one child process per variant, results gathered
into a run document.

Each variant runs in its own interpreter (design §2.3): knobs such as
CUBLAS_WORKSPACE_CONFIG must be set before torch starts, and a crash or a hang in one
variant must not lose the others; a GPU that crashes or hangs its children fails its
own results only. This module does not import torch.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from numparity_agent import _devices, _variants, _workloads
from numparity_agent._document import build_document, utc_now
from numparity_agent._knobs import numeric_env_vars
from numparity_agent._log import log

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
    workloads: Sequence[str], variants: Sequence[str], repeats: int, *, drill: bool = False,
    suite: str = _workloads.SUITE,
) -> None:
    check_suite(suite)
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
    leaves out unless asked for (`_workloads.NOT_BY_DEFAULT`)."""
    skipped = _workloads.NOT_BY_DEFAULT.get(suite, frozenset())
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


def run_variant(
    variant: str,
    *,
    workloads: Sequence[str],
    device: str,
    repeats: int,
    timeout: float,
    node_env_vars: dict[str, str],
    fault_drill: bool = False,
    on_progress: Callable[[int], None] | None = None,
    values_dir: Path | None = None,
    trace_ops: bool = False,
    suite: str = _workloads.SUITE,
) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """(environment or None, results) of one variant's child process; with
    `fault_drill` the child flips one bit in each workload (design §2.6), with
    `trace_ops` it records each workload's ops (§2.10).
    `on_progress(finished)` is called while the child runs with how many of its
    workloads it has finished."""
    spec = {
        "variant": variant,
        "suite": suite,
        "workloads": list(workloads),
        "device": device,
        "repeats": repeats,
        "node_env_vars": node_env_vars,
        "fault_drill": fault_drill,
        "trace_ops": trace_ops,
        "values_dir": str(values_dir) if values_dir is not None else None,
    }
    env = _variants.get(variant).child_env(dict(os.environ))
    with tempfile.TemporaryDirectory(prefix="numparity-") as tmp:
        spec_path = os.path.join(tmp, "spec.json")
        out_path = os.path.join(tmp, "out.json")
        if on_progress is not None:
            spec["progress"] = os.path.join(tmp, "progress")
        with open(spec_path, "w", encoding="utf-8") as f:
            json.dump(spec, f)
        cmd = [sys.executable, "-m", "numparity_agent._child", spec_path, out_path]
        proc = None
        try:
            if on_progress is None:
                proc = subprocess.run(
                    cmd, env=env, timeout=timeout, capture_output=True, text=True, check=False
                )
            else:
                proc = _run_watched(cmd, env, timeout, str(spec["progress"]), on_progress)
        except subprocess.TimeoutExpired:
            error = f"variant {variant} timed out after {timeout:g} s (child killed)"
        else:
            if proc.returncode == 0 and os.path.exists(out_path):
                with open(out_path, encoding="utf-8") as f:
                    output = json.load(f)
                return output.get("environment"), output["results"]
            error = _child_failure(proc, _describe_exit(proc.returncode))
    return None, [
        {
            "suite": suite,
            "workload": w,
            "workload_version": None,
            "variant": variant,
            "device": device,
            "status": "failed",
            "error": error,
        }
        for w in workloads
    ]


def _run_watched(
    cmd: list[str], env: dict[str, str], timeout: float, progress_path: str,
    on_progress: Callable[[int], None],
) -> subprocess.CompletedProcess[str]:
    """subprocess.run(cmd, timeout=...) that reports the child's progress file meanwhile."""
    deadline = time.monotonic() + timeout
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as child:
        while True:
            try:
                stdout, stderr = child.communicate(
                    timeout=max(0.0, min(PROGRESS_POLL_S, deadline - time.monotonic())))
                break
            except subprocess.TimeoutExpired:
                if time.monotonic() >= deadline:
                    child.kill()
                    child.communicate()
                    raise
                on_progress(_lines(progress_path))
    return subprocess.CompletedProcess(cmd, child.returncode, stdout, stderr)


def _lines(path: str) -> int:
    try:
        with open(path, encoding="utf-8") as f:
            return sum(1 for line in f if line.endswith("\n"))
    except OSError:
        return 0


def _environment_child(timeout: float) -> dict[str, Any]:
    """The environment from a fresh interpreter, when no variant child delivered one."""
    cmd = [sys.executable, "-m", "numparity_agent", "env"]
    proc = subprocess.run(cmd, timeout=timeout, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(_child_failure(proc, _describe_exit(proc.returncode)))
    return json.loads(proc.stdout)


class DeviceListError(RuntimeError):
    """The child that lists the node's devices crashed or timed out."""


def list_devices(timeout: float) -> list[dict[str, Any]]:
    """Every visible device (`_devices.visible_devices`), from a fresh interpreter: CUDA
    and NVML can hang on a wedged GPU, and the agent's own process stays without torch."""
    cmd = [sys.executable, "-m", "numparity_agent._devices"]
    try:
        proc = subprocess.run(cmd, timeout=timeout, capture_output=True, text=True,
                              check=False)
    except subprocess.TimeoutExpired:
        raise DeviceListError(f"listing the devices timed out after {timeout:g} s") from None
    if proc.returncode != 0:
        raise DeviceListError(_child_failure(proc, _describe_exit(proc.returncode)))
    devices: list[dict[str, Any]] = json.loads(proc.stdout)
    return devices


def select_devices(selection: str, *, timeout: float = DEFAULT_TIMEOUT_S
                   ) -> list[dict[str, Any]]:
    """The devices `selection` names (`cuda:0,cuda:3`, `cpu`, `all`: every visible CUDA
    device, else the CPU). UsageError when it names one this node does not show (the
    message lists those it does); DeviceListError when they cannot be listed."""
    try:
        items = _devices.parse_selection(selection)
        wanted = _devices.needs_cuda(items) and _devices.gpu_driver_present()
        visible = list_devices(timeout) if wanted else []
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


def _log_results(log_line: Callable[[str], None], prefix: str,
                 results: list[dict[str, Any]]) -> None:
    for result in results:
        status = result["status"]
        detail = ""
        if status == "ok":
            detail = f" in {result['wall_s']:.3f} s, repeats agree: {result['repeats_agree']}"
            if "drill" in result:
                flip = result["drill"]
                detail += (
                    f"; fault drill flipped bit {flip['bit']} of {flip['layer']}"
                    f"[{flip['index']}]: {flip['before']!r} -> {flip['after']!r}"
                )
        elif status == "failed":
            detail = ": " + result["error"].strip().splitlines()[0]
        else:
            detail = ": " + result.get("reason", "")
        log_line(f"{prefix}variant {result['variant']}: {result['workload']} {status}{detail}")


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
    drill: bool = False,
    drill_device: str | None = None,
    on_progress: Progress | None = None,
    values_dir: Path | None = None,
    trace_ops: bool = False,
    suite: str = _workloads.SUITE,
) -> dict[str, Any]:
    """Run `workloads` of `suite` under `variants` (by default its built-ins under
    `default_variants(suite)`) on each device: the run document. Large tensors' values
    are kept in `values_dir` when given (`_values`).

    `device` is a selection (see select_devices; default every visible CUDA device,
    else the CPU) or the devices select_devices gave for one. Devices run one after
    another, each variant of each in its own child; the float64 reference runs once,
    on the CPU (device_plan). The document lists the devices with the seconds each
    took and its status: "failed" when every one of its results failed.

    With `drill` (`run --fault-drill`, design §2.6) the document is marked as a drill
    and, in the FAULT_DRILL_VARIANT on `drill_device` only (default: the first
    device), every workload that records layers has one bit of one activation
    flipped; everything else runs as without it.
    `on_progress` follows the run workload by workload (see Progress). With
    `trace_ops` every variant records each workload's ops (design §2.10): the document
    carries the trace bodies in `traces`, each result the hash of its own.
    """
    check_suite(suite)
    workloads = list(workloads or _workloads.builtin_names(suite))
    variants = list(variants or default_variants(suite))
    validate(workloads, variants, repeats, drill=drill, suite=suite)
    devices = select_devices(device, timeout=timeout) if isinstance(device, str) else device
    drill_at = drill_slot(devices, drill_device) if drill else None
    plan = device_plan(devices, variants)
    several = len(plan) > 1
    if several:
        log_line("devices: " + "; ".join(
            f"{_devices.describe(d)}: {', '.join(runs)}" for d, runs in plan))
    if drill:
        log_line(
            f"fault drill: one bit flipped per workload in {_variants.FAULT_DRILL_VARIANT} "
            f"on {drill_at}; the document is marked as a drill"
        )
    node_env_vars = numeric_env_vars()
    started_at = utc_now()
    environment: dict[str, Any] | None = None
    results: list[dict[str, Any]] = []
    entries: list[dict[str, Any]] = []
    per_device = device_workloads(plan, workloads)
    total = sum(len(runs) * len(names) for (_, runs), names in zip(plan, per_device,
                                                                    strict=True))
    for (entry, runs), on_device in zip(plan, per_device, strict=True):
        slot = entry["device"]
        prefix = f"{slot} " if several else ""
        device_started = time.monotonic()
        device_results: list[dict[str, Any]] = []
        for variant in runs:
            log_line(f"{prefix}variant {variant}: running {', '.join(on_device)}"
                     + ("" if several else f" on {slot}"))
            watch = None
            if on_progress is not None:
                def watch(finished: int, variant: str = variant, done: int = len(results),
                          prefix: str = prefix, on_device: list[str] = on_device) -> None:
                    now = on_device[min(finished, len(on_device) - 1)]
                    on_progress(done + finished, total, f"{prefix}{now}/{variant}")

                watch(0)
            started = time.monotonic()
            child_env, child_results = run_variant(
                variant,
                workloads=on_device,
                device=slot,
                repeats=repeats,
                timeout=timeout,
                node_env_vars=node_env_vars,
                fault_drill=(drill_at == slot and variant == _variants.FAULT_DRILL_VARIANT),
                on_progress=watch,
                values_dir=values_dir,
                trace_ops=trace_ops,
                suite=suite,
            )
            environment = environment or child_env
            _log_results(log_line, prefix, child_results)
            results.extend(child_results)
            device_results.extend(child_results)
            log_line(f"{prefix}variant {variant}: done in {time.monotonic() - started:.1f} s")
            if on_progress is not None:
                on_progress(len(results), total, f"{prefix}{variant} done")
        wall_s = time.monotonic() - device_started
        failed = all(r["status"] == "failed" for r in device_results)
        entries.append({**entry, "wall_s": round(wall_s, 3),
                        "status": "failed" if failed else "ok"})
        log_line(f"device {_devices.describe(entry)}: done in {wall_s:.1f} s"
                 + (", every result failed" if failed else ""))
    if environment is None:
        try:
            environment = _environment_child(timeout)
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
        drill=drill,
        drill_device=drill_at,
        devices=entries,
    )
