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

import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx

from numparity_agent import _compile, _suite, _variants, _workloads
from numparity_agent._answer import ServerAnswer, answer_of, no_answer, server_message
from numparity_agent._check_budget import (  # noqa: F401 - the command's surface
    Deadline,
    Watchdog,
    budget_start,
)
from numparity_agent._check_verdicts import (  # noqa: F401 - the command's surface
    CHECK_EXIT_CODES_HELP,
    EXIT_FAILED,
    EXIT_GO,
    EXIT_OUT_OF_TIME,
    EXIT_REFUSED,
    EXIT_UNREACHABLE,
    CheckReport,
    DeviceVerdict,
    KeyVerdict,
    compare,
    worst,
)
from numparity_agent._knobs import numeric_env_vars
from numparity_agent._log import log
from numparity_agent._proof import plan_proof

CHECK_PATH = "/api/v1/agent/check"
DEFAULT_MAX_SECONDS = 60.0
# A variant's child is not started with less than this left: torch's import alone takes
# about as long, so it could not finish.
MIN_CHILD_S = 2.0


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


def _plan_problem(answer: Any, *, suite: str, allowed: frozenset[str]) -> str | None:
    """Why this node does not compute an answer of the plan, or None. The plan is data
    from the server, which holds what any node uploaded: only a workload of this node's
    own suite (or a `module:factory` this node's own configuration or command line
    names) and a known variant are ever run; nothing else is imported."""
    if not isinstance(answer, Mapping):
        return "the server's plan holds a malformed entry"
    workload, variant = answer.get("workload"), answer.get("variant")
    if not isinstance(workload, str) or not isinstance(variant, str):
        return "the server's plan names no workload or variant"
    tensors, version = answer.get("tensors"), answer.get("workload_version")
    if not isinstance(answer.get("manifest_hash"), str) or not isinstance(tensors, list) \
            or not all(isinstance(t, list | tuple) and len(t) == 2
                       and all(isinstance(part, str) for part in t) for t in tensors) \
            or answer.get("source") not in ("pin", "fleet") \
            or not (version is None or type(version) is int):
        return "the server's plan gives no answer to compare with"
    if workload not in _workloads.SUITES.get(suite, {}) and workload not in allowed:
        return (f"not a workload of suite {suite}, nor one this node's configuration names: "
                "not run")
    if variant not in _variants.VARIANTS:
        return "not a variant this agent knows: not run"
    return None


def allowed_plan(expected: Any, *, suite: str, allowed: frozenset[str]
                 ) -> tuple[list[Mapping[str, Any]], list[KeyVerdict]]:
    """The plan's answers this node computes, and a verdict `unchecked` (with the reason)
    for each of the others."""
    runnable: list[Mapping[str, Any]] = []
    refused: list[KeyVerdict] = []
    for answer in expected if isinstance(expected, list) else []:
        problem = _plan_problem(answer, suite=suite, allowed=allowed)
        if problem is None:
            runnable.append(answer)
            continue
        name = answer if isinstance(answer, Mapping) else {}
        refused.append(KeyVerdict(str(name.get("workload", "?"))[:128],
                                  str(name.get("variant", "?"))[:64],
                                  str(name.get("source", "?"))[:8], "unchecked", problem))
    return runnable, refused


def undecided_keys(entries: Any) -> list[KeyVerdict]:
    """The plan's keys that the server could not decide, as `unchecked` verdicts with the
    server's reason."""
    found = []
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, Mapping) and isinstance(entry.get("workload"), str) \
                and isinstance(entry.get("variant"), str):
            note = entry.get("note")
            found.append(KeyVerdict(entry["workload"][:128], entry["variant"][:64], "fleet",
                                    "unchecked", (note if isinstance(note, str) else
                                                  "the fleet gives no answer")[:300]))
    return found


def check_device(device: Mapping[str, Any], expected: Sequence[Mapping[str, Any]], *,
                 deadline: Deadline, suite: str, node_env_vars: dict[str, str],
                 drill: bool | str, compile_cache: Path | None = None) -> list[KeyVerdict]:
    """Compute the expected answers' workloads on one device, a child per variant (strict
    first), each given only the time left; compare each result. ``expected`` holds only
    what ``allowed_plan`` lets this node run."""
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
            fault_drill=drill if variant == _variants.FAULT_DRILL_VARIANT else False,
            compile_cache=compile_cache or _compile.default_cache_dir())
        by_workload = {r["workload"]: r for r in results}
        verdicts.extend(compare(answer, by_workload.get(answer["workload"]), key)
                        for answer, key in zip(answers, keys, strict=True))
    return verdicts


def run_check(*, client: httpx.Client, server: str, token: str | None,
              devices: Sequence[dict[str, Any]], environment: Mapping[str, Any],
              deadline: Deadline, child_s: float, suite: str, workloads: Sequence[str],
              variants: Sequence[str], fail_open: bool, drill_at: str | None,
              upload_timeout: float, allowed: Sequence[str] = (),
              drill: bool | str = True, compile_cache: Path | None = None) -> CheckReport:
    """Ask the server, compute on every device at once, compare: the report.
    ``allowed``: the `module:factory` workloads this node's own settings name (besides
    ``workloads``), the only ones outside the suite a plan may make it run. ``drill``:
    what the drilled device (``drill_at``) runs, the tensor drill (True) or an op drill's
    `op:SPEC` (`_drill_spec`). ``compile_cache``: Inductor's cache folder for a compiled
    answer (the node's `compile_cache` setting; default the state folder's)."""
    models = list(dict.fromkeys(device_model(d) for d in devices))
    env_key = str(environment.get("env_key") or "")
    report = CheckReport(devices=[], fail_open=fail_open, env_key=env_key or None,
                         drill=drill_at is not None)
    answer, plan = fetch_plan(
        client, server, token, suite=suite, env_key=env_key, models=models,
        stack=stack_of(environment), workloads=workloads, variants=variants,
        budget_s=deadline.left(), child_s=child_s,
        timeout=max(0.1, min(upload_timeout, deadline.left())))
    if plan is None:
        report.cause_code = EXIT_REFUSED if answer.refused else EXIT_UNREACHABLE
        report.detail = server_message(answer.detail) if answer.status else answer.detail
        return report
    chosen_by = plan.get("chosen_by")
    report.chosen_by = chosen_by if isinstance(chosen_by, str) else None
    entries = plan.get("devices")
    planned = {entry["model"]: entry for entry in entries if isinstance(entry, dict)
               and isinstance(entry.get("model"), str)} if isinstance(entries, list) else {}
    permitted = frozenset(w for w in (*workloads, *allowed) if _workloads.is_factory_spec(w))
    verdicts = []
    runnable: list[list[Mapping[str, Any]]] = []
    for device in devices:
        entry = planned.get(device_model(device), {})
        note = entry.get("note")
        verdicts.append(DeviceVerdict(
            device=device["device"], name=device.get("name"), uuid=device.get("uuid"),
            model=device_model(device), source=str(entry.get("source", "none"))[:8],
            against=_against(entry), note=note if isinstance(note, str) else None))
        chosen, refused = allowed_plan(entry.get("checks") or [], suite=suite,
                                       allowed=permitted)
        runnable.append(chosen)
        # Keys the fleet cannot decide (split without a majority, too few nodes): shown,
        # never silently left out.
        verdicts[-1].keys = [*refused, *undecided_keys(entry.get("undecided"))]
        verdicts[-1].drilled = drill_at == device["device"]
    node_env_vars = numeric_env_vars()

    def one(index: int) -> list[KeyVerdict]:
        device = devices[index]
        started = time.monotonic()
        try:
            return check_device(device, runnable[index], deadline=deadline, suite=suite,
                                node_env_vars=node_env_vars,
                                drill=drill if drill_at == device["device"] else False,
                                compile_cache=compile_cache)
        finally:
            verdicts[index].seconds = time.monotonic() - started

    # Every device at once: each GPU runs its own children, so a node's check takes one
    # device's time, not eight.
    with ThreadPoolExecutor(max_workers=max(1, len(devices))) as pool:
        for verdict, keys in zip(verdicts, pool.map(one, range(len(devices))), strict=True):
            verdict.keys = [*keys, *verdict.keys]
    report.devices = verdicts
    report.cause_code = worst([verdict.code for verdict in verdicts])
    # The measured coverage and false alarms of the plan's strict workloads (issue 44).
    report.proof = plan_proof(list(dict.fromkeys(
        answer["workload"] for chosen in runnable for answer in chosen
        if answer["variant"] == _variants.FAULT_DRILL_VARIANT)))
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
