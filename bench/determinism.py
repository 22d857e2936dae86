"""Selective determinism benchmark (design §2.13): what making only the nondeterministic
op deterministic costs, next to making everything so. Not run by CI.

    .venv/bin/python bench/determinism.py [--rounds 15] [--studies 3] [--budget 60]
                                          [--omp-dynamic]

1. The agent's own study (`_runner.study_nondeterminism`) on a model with one
   nondeterministic op (bench/_nondeterministic.py: a custom op in `pool`, after six
   linear blocks): two traced passes name the op, then default, strict (every
   determinism flag) and selective (only `pool`) run in paired, interleaved rounds, at
   least `--rounds`, more until the intervals are narrow or `--budget` seconds are
   spent. Each of `--studies` studies is one measurement, printed as the agent reports
   it (the median paired ratio with its 95 % bootstrap interval, `_cost`), then combined
   with the audit's rule (weighted by precision, `analysis.nondeterminism.
   combined_cost`), in the audit's words.
2. With `--omp-dynamic`: why `train` is nondeterministic on a loaded CPU. A getloadavg()
   shim (LD_PRELOAD, compiled here with cc) reports a 15-minute load of 0.0 or 1.5 in
   alternating 1 ms windows — a 2-core node whose load hovers at libgomp's boundary,
   compressed in time — and `train` runs 8 repeats under OMP_DYNAMIC=true and =false,
   in 3 processes each.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from numparity_agent._determinism import scopes  # noqa: E402
from numparity_agent._runner import cost_study, study_nondeterminism  # noqa: E402
from numparity_agent.testing import load_workload, variant  # noqa: E402
from numparity_server.analysis.nondeterminism import (  # noqa: E402
    StudyCost,
    combined_cost,
    cost_in_words,
)

SHIM = r"""
#include <time.h>
int getloadavg(double loadavg[], int nelem) {
  struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts);
  long long ms = ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
  double v = (ms % 2) ? 1.5 : 0.0;
  for (int i = 0; i < nelem && i < 3; i++) loadavg[i] = v;
  return nelem < 3 ? nelem : 3;
}
"""
TRAIN = """
import torch
from numparity_agent.testing import load_workload, run_workload, variant
r = run_workload(load_workload("train"), variant=variant("default"),
                 device=torch.device("cpu"), repeats=8)
print(r["repeats_agree"], ",".join(r.get("repeats_differ", [])[:4]))
"""


def selective_against_strict(rounds: int, studies: int, budget: float) -> None:
    workload = load_workload("_nondeterministic:pooled")
    first = study_nondeterminism(workload, variant=variant("default"), dtype=torch.float32,
                                 device=torch.device("cpu"), rounds=rounds, budget_s=budget)
    ops = first.get("ops") or []
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; named ops: "
          + "; ".join(f"{op['op']} in {op['module']} ({op['phase']}), recipe "
                      f"{op.get('recipe')}" for op in ops))
    print(f"scopes: {scopes(ops)}")
    found = [first["cost"]]
    for _ in range(studies - 1):
        found.append(cost_study(workload, variant=variant("default"), dtype=torch.float32,
                                device=torch.device("cpu"), ops=ops, rounds=rounds,
                                budget_s=budget))
    print(f"\n{studies} studies, each at least {rounds} paired rounds (the first a "
          f"warm-up), more until narrow or {budget:g} s; the median paired ratio and its "
          "95 % bootstrap interval, as the agent reports it:")
    print(f"{'study':>5} {'rounds':>6} {'load':>6} {'default s':>10}  "
          f"{'strict ratio [95 %]':<22} {'selective ratio [95 %]':<22} repeatable "
          "(default/strict/selective)")
    for index, cost in enumerate(found, start=1):
        print(f"{index:>5} {cost['rounds']:>6} {cost['load']['load']!s:>6} "
              f"{cost['default']['wall_s']:>10.4f}  {_interval(cost['strict']):<22} "
              f"{_interval(cost['selective']):<22} "
              + "/".join(str(cost[m]["repeatable"]) for m in ("default", "strict",
                                                              "selective")))
        for mode in ("strict", "selective"):
            print(f"{'':>5} {mode}: {cost[mode]['cost']}")
    # The audit's rule: the studies combined by their precision (as if from several
    # nodes), in the audit's words.
    combined = {mode: combined_cost([
        StudyCost(c[mode]["ratio"], c[mode]["ratio_low"], c[mode]["ratio_high"],
                  c[mode]["repeatable"], c["load"]["load"], c["load"]["cpus"])
        for c in found]) for mode in ("strict", "selective")}
    print("\ncombined (the audit's rule): " + cost_in_words(
        ops[0].get("recipe") if ops else None, ops[0].get("no_recipe") if ops else None,
        combined["selective"], combined["strict"]))


def _interval(mode: dict[str, float]) -> str:
    """The raw figure, whatever its verdict: ratio [low, high]."""
    return f"{mode['ratio']:.3f} [{mode['ratio_low']:.3f}, {mode['ratio_high']:.3f}]"


def omp_dynamic() -> None:
    with tempfile.TemporaryDirectory() as folder:
        source, shim = Path(folder) / "shim.c", Path(folder) / "shim.so"
        source.write_text(SHIM)
        subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", str(shim), str(source)],
                       check=True)
        print("\ntrain, 8 repeats, load average alternating across libgomp's boundary:")
        for setting in ("true", "false"):
            env = {**os.environ, "OMP_DYNAMIC": setting, "LD_PRELOAD": str(shim)}
            for _ in range(3):
                done = subprocess.run([sys.executable, "-c", TRAIN], env=env, text=True,
                                      capture_output=True, timeout=300, check=True)
                agree, _, differ = done.stdout.strip().partition(" ")
                print(f"  OMP_DYNAMIC={setting:<5}: repeats agree {agree}"
                      + (f" (differ: {differ})" if differ else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--studies", type=int, default=3)
    parser.add_argument("--budget", type=float, default=60.0,
                        help="seconds each study may time rounds for (the agent's default)")
    parser.add_argument("--omp-dynamic", action="store_true")
    args = parser.parse_args()
    selective_against_strict(args.rounds, args.studies, args.budget)
    if args.omp_dynamic:
        omp_dynamic()


if __name__ == "__main__":
    main()
