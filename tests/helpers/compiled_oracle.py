"""Whether torch.compile gives eager's bits under an Inductor setting: the oracle of the
eager-target `explain` tests (design §2.11, §2.14), computed by torch itself.

`python compiled_oracle.py SPEC OUT SETTINGS_JSON` builds workload SPEC twice in a
fresh process (the agent's children are fresh processes too: Inductor's config and the
thread pool are process-wide), runs it eagerly and compiled (Inductor, the forward
compiled in place as the agent does, so the recorded layers are the same graph outputs)
under each setting of SETTINGS_JSON (a list of {name: value} of `torch._inductor.config`,
patched with its own `config.patch`, never the agent's knob code), and writes per setting
whether every recorded tensor is `torch.equal` to eager's, and the first that is not.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def _recorded(spec: str, *, compiled: bool) -> list[tuple[str, Any]]:
    import torch

    from numparity_agent._workloads import load
    from numparity_agent._workloads._base import Recorder

    workload = load(spec)
    built = workload.build(dtype=torch.float32, device=torch.device("cpu"))
    if compiled:
        torch._dynamo.reset()
        built.model.forward = torch.compile(built.model.forward, backend="inductor")
    recorder = Recorder()
    workload.run(built, recorder)
    return [(name, value.detach().clone()) for name, _kind, value in recorder.tensors]


def compare(spec: str, settings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    import torch
    from torch._inductor import config

    eager = _recorded(spec, compiled=False)
    found = []
    for setting in settings:
        if not all(hasattr(config, name) for name in setting):
            found.append({"setting": setting, "applies": False})
            continue
        with config.patch(setting):
            got = dict(_recorded(spec, compiled=True))
        first = next((name for name, value in eager
                      if name not in got or not torch.equal(got[name], value)), None)
        found.append({"setting": setting, "applies": True, "restores": first is None,
                      "first_differing": first})
    return found


def current(names: list[str]) -> dict[str, Any]:
    """The Inductor settings of `names` this torch has, as they are by default."""
    from torch._inductor import config

    return {name: getattr(config, name) for name in names if hasattr(config, name)}


def main(argv: list[str]) -> int:
    spec, out, settings = argv
    answer = {"defaults": current(sorted({n for s in json.loads(settings) for n in s}
                                         | {"emulate_precision_casts", "fallback_random",
                                            "max_autotune", "batch_invariant",
                                            "deterministic"})),
              "found": compare(spec, json.loads(settings))}
    with open(out, "w", encoding="utf-8") as f:
        json.dump(answer, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
