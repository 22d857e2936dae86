"""Run one workload under the current variant, `repeats` times, into a result entry."""

from __future__ import annotations

import time
import traceback
from typing import Any

import torch

from numparity_agent._fingerprint import combined_hash, fingerprint, tensor_hash
from numparity_agent._knobs import read_knobs
from numparity_agent._variants import Variant
from numparity_agent._workloads._base import Recorder, Workload


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
    try:
        for repeat in range(repeats):
            built = workload.build(dtype=dtype, device=device)
            hashes = [
                ("<inputs>", combined_hash(list(built.inputs.items()))),
                ("<params>", combined_hash(list(built.model.state_dict().items()))),
            ]
            if repeat == 0:
                input_hash, param_hash = hashes[0][1], hashes[1][1]
            recorder = Recorder()
            _sync(device)
            start = time.perf_counter()
            with variant.run_context(device):
                workload.run(built, recorder)
            _sync(device)
            times.append(time.perf_counter() - start)
            for order, (name, kind, value) in enumerate(recorder.tensors):
                if repeat == 0:
                    entry = {"name": name, "kind": kind, "order": order, **fingerprint(value)}
                    tensors.append(entry)
                    hashes.append((name, entry["hash"]))
                else:
                    hashes.append((name, tensor_hash(value)))
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
        "knobs": read_knobs(),
        "tensors": tensors,
    }
    if differing:
        result["repeats_differ"] = differing
    return result


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
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return text[-limit:]
