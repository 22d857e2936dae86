"""The child process of one or more variants: `python -m numparity_agent._child SPEC OUT`.

SPEC is a JSON file {"variants" (or "variant", one), "suite", "workloads", "device",
"repeats", "node_env_vars", "fault_drill", "trace_ops", "study_budget_s", "progress",
"values_dir", "environment", "spawned_at"} (device: the slot, "cuda:3", that the results
name, computed on `_devices.torch_device(slot)`; fault_drill: flip one bit in each
workload of the strict variant, design §2.6 (an `op:SPEC` text: corrupt an op's output
as it is computed); trace_ops: record each workload's ops, §2.10;
study_budget_s: a nondeterministic result's cost study's time budget, §2.13;
progress: a file that gets one line per finished workload, for the parent's progress
display and timeout; values_dir: where large tensors' values are kept, `_values`;
environment: false when the parent has the environment document already; spawned_at:
the parent's `time.time()` at the spawn, for the `start` phase; all optional).

OUT receives {"environment", "results", "timeline", "not_run"} (written atomically, so a
crash leaves none) and, as each variant finishes, `OUT.<i>` its results alone: a crash
or a timeout in a later variant keeps the earlier ones. The environment is captured
before any variant touches a knob, with the node's numeric environment variables (not
the ones a variant added), so that it describes the node as it is configured.

Several variants share a child only when none of them sets anything process-wide
(`Variant.own_process` is false: no environment variable, no global knob; the parent
groups them, design §2.3). Each runs with torch's generators restored afterwards, and
before each one after the first the child checks that the knobs are the node's: if
not, it stops and lists the variants left in `not_run`, which the parent runs in a
fresh child.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

_STARTED = time.time()


def spec_variants(spec: dict[str, Any]) -> list[str]:
    return list(spec.get("variants") or [spec["variant"]])


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    from numparity_agent._timeline import PhaseClock

    clock = PhaseClock()
    if spec.get("spawned_at") is not None:
        clock.add("start", _STARTED - float(spec["spawned_at"]))
    with clock.phase("import"):
        import torch

        from numparity_agent import _devices, _variants, _workloads
        from numparity_agent._environment import capture_environment
        from numparity_agent._knobs import read_knobs
        from numparity_agent._runner import (
            TraceJob,
            _error_text,
            result_head,
            run_traces,
            run_workload,
        )
        from numparity_agent._values import ValuesStore

    names = spec_variants(spec)
    store = ValuesStore(Path(spec["values_dir"])) if spec.get("values_dir") else None
    slot = spec.get("device", "cpu")
    # True: the tensor drill; a text: an op drill (`_drill_spec`); false: none.
    fault_drill = spec.get("fault_drill") or False
    trace = bool(spec.get("trace_ops", False))
    suite = spec.get("suite", _workloads.SUITE)
    results: list[dict[str, Any]] = []
    environment: dict[str, Any] | None = None

    def answer(not_run: list[str] | None = None) -> dict[str, Any]:
        return {"environment": environment, "results": results,
                "timeline": clock.seconds(), "not_run": not_run or [],
                "finished_at": time.time()}

    def all_failed(variant_names: list[str], device_name: str, **fields: Any
                   ) -> list[dict[str, Any]]:
        return [{**result_head(w, None, name, device_name, suite), **fields}
                for name in variant_names for w in spec["workloads"]]

    try:
        # A child that sees only its own device (CUDA_VISIBLE_DEVICES set by the parent,
        # `_suite.isolated_visible`) computes on that process's cuda:0; its results still
        # name the node's slot.
        requested = _devices.torch_device(spec.get("torch_device") or slot)
        with clock.phase("device_init"):
            _init_device(torch, requested)
    except Exception as exc:  # noqa: BLE001
        error = f"{type(exc).__name__}: {exc}"
        if spec.get("environment", True):
            with clock.phase("environment"):
                environment = capture_environment(env_vars=spec.get("node_env_vars"))
        results.extend(all_failed(names, slot, status="failed", error=error))
        return answer()
    if spec.get("environment", True):
        with clock.phase("environment"):
            environment = capture_environment(env_vars=spec.get("node_env_vars"))
        # At once: a variant that hangs or crashes the child loses no environment.
        _write_part(spec.get("out"), "environment", {"environment": environment,
                                                     "results": []})
    node_knobs = read_knobs()
    # The node's configured thread count, read before any variant changes it.
    threads = torch.get_num_threads()
    for position, name in enumerate(names):
        if position and (read_knobs() != node_knobs or torch.get_num_threads() != threads):
            return answer(not_run=names[position:])  # a fresh child runs the others
        variant = _variants.get(name)
        device_name = slot
        # fp64-reference runs on the CPU whatever device the node asked for.
        device = variant.target_device(requested)
        if device != requested:
            device_name = str(device)
        reason = variant.skip_reason(device)
        if reason is not None:
            mine = all_failed([name], device_name, status="skipped", reason=reason)
        else:
            mine = []
            jobs: list[TraceJob] = []
            with torch.random.fork_rng(devices=_cuda_devices(device)):
                variant.apply(device, threads=threads)
                for spec_name in spec["workloads"]:
                    try:
                        workload = _workloads.load(spec_name, suite)
                    except Exception as exc:  # noqa: BLE001
                        mine.append({**result_head(spec_name, None, name, device_name, suite),
                                     "status": "failed", "error": _error_text(exc)})
                    else:
                        skipped = workload.skip_reason(name)
                        if skipped is not None:
                            mine.append({**result_head(spec_name, workload.version, name,
                                                       device_name, suite),
                                         "status": "skipped", "reason": skipped})
                            _report_progress(spec.get("progress"), spec_name, "skipped")
                            continue
                        mine.append(run_workload(
                            workload, variant=variant, device=device, slot=device_name,
                            repeats=min(spec["repeats"], workload.max_repeats or spec["repeats"]),
                            fault_drill=(fault_drill if name == _variants.FAULT_DRILL_VARIANT
                                         else False),
                            keep_values=store.keep if store is not None else None,
                            trace=trace, trace_jobs=jobs,
                            study_budget_s=spec.get("study_budget_s")))
                    clock.merge(mine[-1].get("timeline", {}))
                    _report_progress(spec.get("progress"), spec_name, mine[-1]["status"])
                # The traced passes after every timed run of the variant (one profiler
                # session on CUDA, `run_traces`).
                with clock.phase("trace"):
                    run_traces(jobs)
        results.extend(mine)
        _write_part(spec.get("out"), position, {"environment": environment, "results": mine})
    return answer()


def _init_device(torch: Any, device: Any) -> None:
    """CUDA's initialisation and the device's context, timed on their own (`device_init`)
    rather than inside the first workload: one allocation and a synchronisation."""
    if device.type != "cuda":
        return
    if not torch.cuda.is_available():
        raise RuntimeError(f"device {device} requested but CUDA is not available")
    torch.cuda.init()
    torch.empty(1, device=device)
    torch.cuda.synchronize(device)


def _cuda_devices(device: Any) -> list[Any]:
    return [device] if device.type == "cuda" else []


def _write_part(out: str | None, position: int | str, part: dict[str, Any]) -> None:
    """`OUT.<position>`: one variant's results, written atomically as it finishes
    (`OUT.environment`: the environment, as soon as it is captured)."""
    if not out:
        return
    path = f"{out}.{position}"
    with open(f"{path}.tmp", "w", encoding="utf-8") as f:
        json.dump(part, f)
    os.replace(f"{path}.tmp", path)


def _report_progress(path: str | None, workload: str, status: str) -> None:
    if not path:
        return
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"{workload} {status}\n")
    except OSError:  # the display only: the results are what matters
        pass


def spec_main(module: str, run: Callable[[dict[str, Any]], dict[str, Any]],
              argv: list[str] | None = None) -> int:
    """`python -m <module> SPEC OUT`: `run` the JSON spec, write its answer to OUT
    atomically (a crash leaves no OUT, which the parent reads as a failure)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print(f"usage: python -m {module} SPEC OUT", file=sys.stderr)
        return 2
    spec_path, out_path = args
    with open(spec_path, encoding="utf-8") as f:
        spec = json.load(f)
    spec.setdefault("out", out_path)
    output = run(spec)
    tmp = f"{out_path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(output, f)
    os.replace(tmp, out_path)
    return 0


def main(argv: list[str] | None = None) -> int:
    return spec_main("numparity_agent._child", run_child, argv)


def exit_now(code: int) -> None:
    """End a child process once its answer is written, without the interpreter's
    teardown: torch's (and CUDA's) finalisation took 1 to 3 s of every child on a
    2-core CPU, after the answer was already on disk (`timeline`'s `write`)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
