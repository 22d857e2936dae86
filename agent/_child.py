"""The child process of one variant: `python -m numparity_agent._child SPEC OUT`.

SPEC is a JSON file {"variant", "suite", "workloads", "device", "repeats", "node_env_vars",
"fault_drill", "trace_ops", "progress", "values_dir"} (device: the slot, "cuda:3",
that the results name, computed on `_devices.torch_device(slot)`; fault_drill: flip one
bit in each workload, design §2.6; trace_ops: record each workload's ops, §2.10;
progress: a file that gets one line per finished workload, for the parent's progress
display; values_dir: where large tensors' values are kept, `_values`; all optional);
OUT receives {"environment", "results"} (written atomically, so a crash leaves none).
The environment is captured first, before the variant touches any knob, with the
node's numeric environment variables (not the ones the variant added), so that it
describes the node as it is configured.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    from numparity_agent import _devices, _variants, _workloads
    from numparity_agent._environment import capture_environment
    from numparity_agent._runner import _error_text, result_head, run_workload
    from numparity_agent._values import ValuesStore

    environment = capture_environment(env_vars=spec.get("node_env_vars"))
    store = ValuesStore(Path(spec["values_dir"])) if spec.get("values_dir") else None
    variant = _variants.get(spec["variant"])
    device_name = spec.get("device", "cpu")
    fault_drill = bool(spec.get("fault_drill", False))
    trace = bool(spec.get("trace_ops", False))
    suite = spec.get("suite", _workloads.SUITE)
    results: list[dict[str, Any]] = []

    def all_results(**fields: Any) -> dict[str, Any]:
        return {
            "environment": environment,
            "results": [
                {**result_head(w, None, variant.name, device_name, suite), **fields}
                for w in spec["workloads"]
            ],
        }

    try:
        requested = _devices.torch_device(device_name)
        # fp64-reference runs on the CPU whatever device the node asked for.
        device = variant.target_device(requested)
        if device != requested:
            device_name = str(device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(f"device {device_name} requested but CUDA is not available")
    except Exception as exc:  # noqa: BLE001
        return all_results(status="failed", error=f"{type(exc).__name__}: {exc}")
    reason = variant.skip_reason(device)
    if reason is not None:
        return all_results(status="skipped", reason=reason)
    # The node's configured thread count, read before any variant changes it.
    variant.apply(device, threads=torch.get_num_threads())
    for spec_name in spec["workloads"]:
        try:
            workload = _workloads.load(spec_name, suite)
        except Exception as exc:  # noqa: BLE001
            results.append(
                {
                    **result_head(spec_name, None, variant.name, device_name, suite),
                    "status": "failed",
                    "error": _error_text(exc),
                }
            )
        else:
            skipped = workload.skip_reason(variant.name)
            if skipped is not None:
                results.append({**result_head(spec_name, workload.version, variant.name,
                                              device_name, suite),
                                "status": "skipped", "reason": skipped})
                _report_progress(spec.get("progress"), spec_name, "skipped")
                continue
            results.append(
                run_workload(
                    workload,
                    variant=variant,
                    device=device,
                    slot=device_name,
                    repeats=min(spec["repeats"], workload.max_repeats or spec["repeats"]),
                    fault_drill=fault_drill,
                    keep_values=store.keep if store is not None else None,
                    trace=trace,
                )
            )
        _report_progress(spec.get("progress"), spec_name, results[-1]["status"])
    return {"environment": environment, "results": results}


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
    output = run(spec)
    tmp = f"{out_path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(output, f)
    os.replace(tmp, out_path)
    return 0


def main(argv: list[str] | None = None) -> int:
    return spec_main("numparity_agent._child", run_child, argv)


if __name__ == "__main__":
    sys.exit(main())
