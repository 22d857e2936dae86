"""The child process of `explain` (design §2.11):
`python -m numparity_agent._explain_child SPEC OUT`.

It was started with one candidate's environment variables. SPEC is a JSON file
{"variant", "workloads", "device", "candidates": [{knob: value}], "stop_when":
{workload: [[name, hash], ...]}}: the knob sets to try in turn, each run of each
workload under the variant (applied once, as `run` does) and the knob set, which is
then taken back. OUT receives {"environment", "evaluations": [{"candidate", "workload",
"status", "tensors": [[name, hash], ...], "input_hash", "param_hash", "reason"}]}.
Once a candidate gives every workload's `stop_when` tensors the child stops: nothing
cheaper is left to find.
"""

from __future__ import annotations

from typing import Any


def run_explain_child(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    from numparity_agent import _compile, _devices, _variants, _workloads
    from numparity_agent._environment import capture_environment
    from numparity_agent._fingerprint import tensor_hashes
    from numparity_agent._runner import _error_text, _sync, built_hashes
    from numparity_agent._settings import NotApplicable, knobs_in_force
    from numparity_agent._workloads._base import Recorder

    environment = capture_environment()
    variant = _variants.get(spec["variant"])
    if variant.compiles:
        # The Inductor settings as they are here: candidates leave the current ones out.
        environment["knobs"] = {**(environment.get("knobs") or {}),
                                **_compile.inductor_knobs()}
    device = variant.target_device(_devices.torch_device(spec.get("device", "cpu")))
    evaluations: list[dict[str, Any]] = []
    reason = variant.skip_reason(device)
    workloads = {name: _workloads.load(name) for name in spec["workloads"]}
    if reason is None:
        variant.apply(device, threads=torch.get_num_threads())
    wanted = {name: [list(pair) for pair in pairs]
              for name, pairs in (spec.get("stop_when") or {}).items()}
    for index, knobs in enumerate(spec["candidates"]):
        found_all = bool(wanted)
        for name, workload in workloads.items():
            entry: dict[str, Any] = {"candidate": index, "workload": name}
            if reason is not None:
                evaluations.append({**entry, "status": "skipped", "reason": reason})
                found_all = False
                continue
            try:
                with knobs_in_force(knobs):
                    built = workload.build(dtype=variant.dtype(), device=device)
                    input_hash, param_hash = built_hashes(built)
                    if variant.compiles:
                        # Compiled afresh under this candidate's Inductor settings.
                        _compile.reset()
                        _compile.compile_in_place(built.model)
                    recorder = Recorder()
                    with variant.run_context(device):
                        workload.run(built, recorder)
                    _sync(device)
            except NotApplicable as exc:
                evaluations.append({**entry, "status": "skipped", "reason": str(exc)})
                found_all = False
                continue
            except Exception as exc:  # noqa: BLE001 - one candidate's failure, not all
                evaluations.append({**entry, "status": "failed",
                                    "reason": _error_text(exc, limit=1000)})
                found_all = False
                continue
            names = [tensor_name for tensor_name, _kind, _value in recorder.tensors]
            hashes = tensor_hashes([value for _name, _kind, value in recorder.tensors])
            tensors = [[n, h] for n, h in zip(names, hashes, strict=True)]
            evaluations.append({**entry, "status": "ok", "tensors": tensors,
                                "input_hash": input_hash, "param_hash": param_hash})
            found_all = found_all and wanted.get(name) == tensors
        if found_all:
            break
    return {"environment": environment, "evaluations": evaluations}


def main(argv: list[str] | None = None) -> int:
    from numparity_agent._child import spec_main

    return spec_main("numparity_agent._explain_child", run_explain_child, argv)


if __name__ == "__main__":
    from numparity_agent._child import exit_now

    exit_now(main())
