"""Nondeterminism found, named and fixed, with the agent as a lab runs it.

    PYTHONPATH=examples/determinism python examples/determinism/demo.py

1. `numparity-agent run --trace-ops --repeats 2` on `lab_models`' op-level and
   host-data models: both results' repeats disagree; the op-level one names the op and
   its cost, the host-data one names where the host data enters and the recipe.
2. `numparity-agent doctor --recipe` prints the code for the op-level model; pasted
   after building the model, three forwards compute the same bits.
3. The host-data model with its recipe applied (`host_data_seeded`): repeats agree.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def agent(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "numparity_agent", *args], env=env,
                          capture_output=True, text=True, check=True, timeout=900)


def main() -> None:
    import torch

    sys.path.insert(0, str(HERE))
    import lab_models

    with tempfile.TemporaryDirectory() as folder:
        document = Path(folder) / "run.json"
        agent("run", "--workloads", "lab_models:op_level", "lab_models:host_data",
              "lab_models:host_data_seeded", "--variants", "default", "--repeats", "2",
              "--trace-ops", "--study-budget", "10", "--output", str(document))
        results = {r["workload"]: r for r in json.loads(document.read_text())["results"]}
        for name, result in results.items():
            print(f"{name}: repeats agree: {result['repeats_agree']}")
            study = result.get("nondeterminism") or {}
            for op in study.get("ops") or []:
                cost = study.get("cost") or {}
                print(f"  op {op['op']} in {op['module']}: recipe {op['recipe']}; "
                      f"selective {cost.get('selective', {}).get('cost')}, "
                      f"strict {cost.get('strict', {}).get('cost')}")
            for source in study.get("sources") or []:
                print(f"  enters at {source['op']} in {source['module']} "
                      f"({source.get('at')}): {source['source']}; {source['advice']}")
        recipe = agent("doctor", "--recipe", str(document)).stdout
        print("\ndoctor --recipe:\n" + recipe)
        code = recipe.split("# lab_models:host_data")[0]  # the op-level block
        outputs = []
        for _ in range(3):
            model, inputs = lab_models.op_level()
            exec(code, {"model": model})  # noqa: S102 - the recipe as a user pastes it
            with torch.no_grad():
                outputs.append(model(*inputs.values()))
        same = all(torch.equal(outputs[0], other) for other in outputs[1:])
        print(f"op_level with the pasted recipe, 3 forwards: same bits: {same}")


if __name__ == "__main__":
    main()
