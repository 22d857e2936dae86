"""Run one workload under the current variant, `repeats` times, into a result entry."""

from __future__ import annotations

import time
import traceback
from typing import Any

import torch

from numparity_agent._fingerprint import combined_hash, fingerprint, tensor_hashes
from numparity_agent._knobs import read_knobs
from numparity_agent._variants import Variant
from numparity_agent._workloads._base import Built, Recorder, Workload


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def result_head(
    workload: str, version: int | None, variant: str, device: str, suite: str = "standard"
) -> dict[str, Any]:
    return {
        "suite": suite,
        "workload": workload,
        "workload_version": version,
        "variant": variant,
        "device": device,
    }


def run_workload(
    workload: Workload, *, variant: Variant, device: torch.device, repeats: int
) -> dict[str, Any]:
    """Build and run `workload` `repeats` times; fingerprint every tensor of the first.

    Each repeat rebuilds the model and inputs (a workload that trains mutates them), so
    repeats also check that building is deterministic. `repeats_agree` compares the
    input/param hashes and every tensor hash of all repeats; `wall_s` is the mean time
    of one run (building and fingerprinting excluded).
    """
    head = result_head(workload.name, workload.version, variant.name, str(device), workload.suite)
    dtype = variant.dtype()
    tensors: list[dict[str, Any]] = []
    signatures: list[list[tuple[str, str]]] = []
    times: list[float] = []
    input_hash = param_hash = None
    fields: dict[str, Any] = {}
    try:
        for repeat in range(repeats):
            built = workload.build(dtype=dtype, device=device)
            built_inputs, built_params = built_hashes(built)
            hashes = [("<inputs>", built_inputs), ("<params>", built_params)]
            if repeat == 0:
                input_hash, param_hash = built_inputs, built_params
            recorder = Recorder()
            _sync(device)
            start = time.perf_counter()
            with variant.run_context(device):
                workload.run(built, recorder)
            _sync(device)
            times.append(time.perf_counter() - start)
            if repeat == 0:
                fields = recorder.fields
            if repeat == 0:
                for order, (name, kind, value) in enumerate(recorder.tensors):
                    entry = {"name": name, "kind": kind, "order": order, **fingerprint(value)}
                    tensors.append(entry)
                    hashes.append((name, entry["hash"]))
            else:  # later repeats only need the hashes
                names = [name for name, _, _ in recorder.tensors]
                values = [value for _, _, value in recorder.tensors]
                hashes.extend(zip(names, tensor_hashes(values), strict=True))
            signatures.append(hashes)
            del built, recorder
    except Exception as exc:  # noqa: BLE001 - one workload's failure must not stop others
        return {**head, "status": "failed", "error": _error_text(exc)}
    differing = _repeat_differences(signatures)
    result: dict[str, Any] = {
        **head,
        "status": "ok",
        "dtype": str(dtype).removeprefix("torch."),
        "input_hash": input_hash,
        "param_hash": param_hash,
        "repeats": repeats,
        "repeats_agree": not differing,
        "wall_s": round(sum(times) / len(times), 6),
        "wall_s_repeats": [round(t, 6) for t in times],
        "knobs": {**read_knobs(), **variant.knobs(device)},
        "tensors": tensors,
    }
    # Workload-specific fields ("train", "probes"); they never replace a contract field.
    result.update({k: v for k, v in fields.items() if k not in result})
    if differing:
        result["repeats_differ"] = differing
    return result


def built_hashes(built: Built) -> tuple[str, str]:
    """(input_hash, param_hash) of a built workload, before it runs (DESIGN §2.1)."""
    return (
        combined_hash(list(built.inputs.items())),
        combined_hash(list(built.model.state_dict().items())),
    )


def _repeat_differences(signatures: list[list[tuple[str, str]]]) -> list[str]:
    """Names whose hash differs from the first repeat (a changed tensor list counts)."""
    first = dict(signatures[0])
    names = [name for name, _ in signatures[0]]
    differing = set()
    for signature in signatures[1:]:
        if [name for name, _ in signature] != names:
            differing.add("<tensor list>")
        differing.update(name for name, h in signature if first.get(name) != h)
    return sorted(differing)


def _error_text(exc: BaseException, limit: int = 4000) -> str:
    """The exception's own last line first (what logs and dashboards show), then the
    end of the traceback."""
    summary = "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return f"{summary[-1] if summary else type(exc).__name__}\n\n{text[-limit:]}"
