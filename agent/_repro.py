"""`numparity-agent repro RUN.json --workload W --variant compiled` (design §2.14): a
standalone script that reproduces a compiled result's difference from eager in a fresh
process, as PyTorch's accuracy minifier writes one — for a lab to run again, or send
upstream.

The script builds the workload's portable inputs and weights with this agent (checked
against the run's `input_hash` and `param_hash`, so it computes from the run's very
bytes), then runs the module the run's localisation named (else the whole model) in
eager and through torch.compile (Inductor), and asserts that the two give the same bits:
on the node that produced the run it fails, printing where and by how much.

This module does not import torch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from numparity_agent import _variants


class ReproError(ValueError):
    """The run document has no such result to reproduce (the message says why)."""


def find_result(document: dict[str, Any], *, workload: str, variant: str,
                device: str | None = None) -> dict[str, Any]:
    """The result of `workload` under `variant` (on `device`, else the first)."""
    if not _variants.VARIANTS.get(variant, _variants.Default()).compiles:
        raise ReproError(f"repro reproduces a compiled result's difference from eager; "
                         f"{variant} does not compile (try --variant "
                         f"{_variants.COMPILED_VARIANT})")
    found = [r for r in document.get("results") or []
             if r.get("workload") == workload and r.get("variant") == variant
             and (device is None or r.get("device") == device)]
    if not found:
        raise ReproError(f"the run has no result of {workload} under {variant}"
                         + (f" on {device}" if device else ""))
    result = found[0]
    if result.get("status") != "ok":
        raise ReproError(f"{workload}/{variant} is {result.get('status')} in the run: "
                         f"{result.get('reason') or result.get('error') or ''}".strip())
    return result


def script(document: dict[str, Any], result: dict[str, Any]) -> str:
    """The script's text (see the module docstring)."""
    located = result.get("localisation") or {}
    device = str(result.get("device") or "cpu")
    constants = {
        "SUITE": result.get("suite", "standard"),
        "WORKLOAD": result["workload"],
        "DTYPE": result.get("dtype", "float32"),
        "DEVICE": "cuda" if device.startswith("cuda") else device,
        "MODULE": located.get("module"),
        "TENSOR": located.get("first_differing"),
        "INPUT_HASH": result.get("input_hash"),
        "PARAM_HASH": result.get("param_hash"),
    }
    node = (document.get("node") or {}).get("name", "?")
    torch_version = ((document.get("environment") or {}).get("torch") or {}).get("version")
    said = ("the module " + repr(located["module"]) if located.get("module")
            else "the whole model")
    lines = [
        "#!/usr/bin/env python3",
        f'"""torch.compile (Inductor) against eager: {result["workload"]} on node {node}',
        f"(run {document.get('run_id')}, torch {torch_version}, device {device}).",
        "",
        f"Written by `numparity-agent repro`. It runs {said} in eager and compiled on the",
        "run's own inputs and weights (built by numparity_agent from its portable",
        "generator and checked against the run's hashes) and asserts the same bits; it",
        "fails where the run found a difference. A `module:factory` workload must be",
        'importable (PYTHONPATH).\n"""',
        "",
        "import sys",
        "",
        "import torch",
        "",
        "from numparity_agent._runner import built_hashes",
        "from numparity_agent._workloads import load",
        "from numparity_agent._workloads._base import Recorder, layer_tensors",
        "",
    ]
    lines += [f"{name} = {value!r}" for name, value in constants.items()]
    lines.append(_BODY)
    return "\n".join(lines)


_BODY = '''

def captured_input(workload, built, name):
    """The first input (args, kwargs) module `name` gets in an eager run."""
    module = dict(built.model.named_modules())[name]
    seen = []

    def keep(_module, args, kwargs):
        if not seen:
            seen.append(([a.detach().clone() if isinstance(a, torch.Tensor) else a
                          for a in args],
                         {k: v.detach().clone() if isinstance(v, torch.Tensor) else v
                          for k, v in kwargs.items()}))

    handle = module.register_forward_pre_hook(keep, with_kwargs=True)
    try:
        workload.run(built, Recorder())
    finally:
        handle.remove()
    return module, seen[0]


def recorded(workload, built):
    recorder = Recorder()
    workload.run(built, recorder)
    return {name: value for name, _kind, value in recorder.tensors}


def same_bits(a, b):
    return (a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.detach().cpu().contiguous().reshape(-1).view(torch.uint8),
        b.detach().cpu().contiguous().reshape(-1).view(torch.uint8)))


def main():
    workload = load(WORKLOAD, SUITE)
    dtype, device = getattr(torch, DTYPE), torch.device(DEVICE)
    built = workload.build(dtype=dtype, device=device)
    if built_hashes(built) != (INPUT_HASH, PARAM_HASH):
        print("this machine builds other inputs or weights than the run: cannot reproduce")
        return 2
    if MODULE is not None:
        module, (args, kwargs) = captured_input(workload, built, MODULE)
        with torch.no_grad():
            eager = layer_tensors(module(*args, **kwargs))
            compiled = layer_tensors(torch.compile(module, backend="inductor")(*args,
                                                                               **kwargs))
        where = f"module {MODULE}"
    else:
        eager_all = recorded(workload, built)
        again = workload.build(dtype=dtype, device=device)
        again.model.forward = torch.compile(again.model.forward, backend="inductor")
        compiled_all = recorded(workload, again)
        name = TENSOR or "output"
        eager, compiled = [eager_all[name]], [compiled_all[name]]
        where = f"tensor {name} of the whole model"
    differing = []
    for position, (e, c) in enumerate(zip(eager, compiled)):
        if same_bits(e, c):
            continue
        diff = (c.double() - e.double()).abs()
        count = int((e.reshape(-1).view(torch.uint8).reshape(e.numel(), -1)
                     != c.reshape(-1).view(torch.uint8).reshape(c.numel(), -1)).any(1).sum())
        differing.append(f"{where} output {position}: {count} of {e.numel()} elements "
                         f"differ, max abs {float(diff.max()):.3e}")
    print("\\n".join(differing) or f"{where}: compiled gives eager's bits here")
    assert not differing, "torch.compile (Inductor) gives other bits than eager"
    return 0


if __name__ == "__main__":
    sys.exit(main())
'''


def write(run_path: Path, *, workload: str, variant: str, output: Path | None,
          device: str | None = None) -> Path:
    """Write the script for `workload`/`variant` of the run document at `run_path`
    (to `output`, default `repro_<workload>_<variant>.py` in the working folder)."""
    try:
        document = json.loads(run_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ReproError(f"cannot read the run document {run_path}: {exc}") from None
    result = find_result(document, workload=workload, variant=variant, device=device)
    safe = "".join(c if c.isalnum() else "_" for c in workload)
    target = output or Path(f"repro_{safe}_{variant}.py")
    target.write_text(script(document, result), encoding="utf-8")
    return target
