"""Selective determinism benchmark (design §2.13): what making only the nondeterministic
op deterministic costs, next to making everything so. Not run by CI.

    .venv/bin/python bench/determinism.py [--rounds 15] [--studies 3] [--omp-dynamic]

1. The agent's own study (`_runner.study_nondeterminism`) on a model with one
   nondeterministic op (bench/_nondeterministic.py: a custom op in `pool`, after six
   linear blocks): two traced passes name the op, then default, strict (every
   determinism flag) and selective (only `pool`) run interleaved `--rounds` times. Each
   of `--studies` studies is one measurement; the overheads against default are
   printed per study and combined with the audit's rule (`determinism_cost.measured`
   and `ratio`: the mean of the medians, uncertainty from their spread), as the audit
   shows them: "deterministic for +x % ± e instead of +y % ± e".
2. With `--omp-dynamic`: why `train` is nondeterministic on a loaded CPU. A getloadavg()
   shim (LD_PRELOAD, compiled here with cc) reports a 15-minute load of 0.0 or 1.5 in
   alternating 1 ms windows — a 2-core node whose load hovers at libgomp's boundary,
   compressed in time — and `train` runs 8 repeats under OMP_DYNAMIC=true and =false,
   in 3 processes each.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
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
from numparity_server.analysis.determinism_cost import Measured, measured, ratio  # noqa: E402
from numparity_server.analysis.nondeterminism import cost_in_words, percent  # noqa: E402

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


def selective_against_strict(rounds: int, studies: int) -> None:
    workload = load_workload("_nondeterministic:pooled")
    first = study_nondeterminism(workload, variant=variant("default"), dtype=torch.float32,
                                 device=torch.device("cpu"), rounds=rounds)
    ops = first.get("ops") or []
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; named ops: "
          + "; ".join(f"{op['op']} in {op['module']} ({op['phase']}), recipe "
                      f"{op.get('recipe')}" for op in ops))
    print(f"scopes: {scopes(ops)}")
    found = [first["cost"]]
    for _ in range(studies - 1):
        found.append(cost_study(workload, variant=variant("default"), dtype=torch.float32,
                                device=torch.device("cpu"), ops=ops, rounds=rounds))
    print(f"\n{studies} studies of {rounds} interleaved rounds each (the first a warm-up):")
    print(f"{'study':>5} {'default s':>10} {'strict':>16} {'selective':>16} repeatable "
          "(default/strict/selective)")
    for index, cost in enumerate(found, start=1):
        default = Measured(cost["default"]["wall_s"], cost["default"].get("wall_s_spread"))
        texts = [percent(ratio(Measured(cost[m]["wall_s"], cost[m].get("wall_s_spread")),
                               default)) for m in ("strict", "selective")]
        print(f"{index:>5} {default.seconds:>10.4f} {texts[0]:>16} {texts[1]:>16} "
              + "/".join(str(cost[m]["repeatable"]) for m in ("default", "strict",
                                                              "selective")))
    # Paired: each round ran the three modes back to back, so the machine's load hits a
    # round's three alike; the median of the per-round ratios and its standard error
    # from the median absolute deviation (1.2533 · 1.4826 · MAD / √n: robust to the
    # outliers another job's burst makes), over every timed round of every study.
    for mode in ("strict", "selective"):
        per_round = [s / d for c in found for d, s in zip(c["default"]["wall_s_rounds"][1:],
                                                          c[mode]["wall_s_rounds"][1:],
                                                          strict=True)]
        middle = statistics.median(per_round)
        mad = statistics.median(abs(r - middle) for r in per_round)
        error = 1.2533 * 1.4826 * mad / math.sqrt(len(per_round))
        print(f"paired, {mode:>9}: {(middle - 1) * 100:+.1f} % "
              f"± {error * 100:.1f} over {len(per_round)} rounds")
    combined = {m: measured(Measured(c[m]["wall_s"], c[m].get("wall_s_spread"))
                            for c in found) for m in ("default", "strict", "selective")}
    strict = ratio(combined["strict"], combined["default"])
    selective = ratio(combined["selective"], combined["default"])
    print("\ncombined (the audit's rule): " + cost_in_words(
        ops[0].get("recipe") if ops else None, ops[0].get("no_recipe") if ops else None,
        selective, all(c["selective"]["repeatable"] for c in found), strict,
        all(c["strict"]["repeatable"] for c in found)))


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
    parser.add_argument("--omp-dynamic", action="store_true")
    args = parser.parse_args()
    selective_against_strict(args.rounds, args.studies)
    if args.omp_dynamic:
        omp_dynamic()


if __name__ == "__main__":
    main()
