"""The large suite on this machine: per workload, its wall time and its FLOPs beside the
A100 estimate. Not run by CI.

    .venv/bin/python bench/large_suite.py [--variants default] [--repeats 2] [--device cpu]

Each workload runs in its own `numparity-agent run --suite large --workloads W` (the
real CLI, so a variant child each: its start, torch import and environment capture are
in the workload's time). Printed per workload: the CLI's wall time; `compute`, the sum
of the document's `wall_s_repeats` (the workload's runs alone); `rest`, the difference
(building the inputs, hashing them, fingerprinting, the child's start); its GFLOP per
run and the A100 estimate (`numparity-agent suites`). Then the totals.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from numparity_agent._workloads import _sizes


def run_workload(workload: str, variants: list[str], repeats: int, device: str
                 ) -> tuple[float, float, list[str]]:
    """(wall s of the CLI, compute s of every run, statuses) of one workload."""
    with tempfile.TemporaryDirectory() as tmp:
        output = os.path.join(tmp, "doc.json")
        cmd = [sys.executable, "-m", "numparity_agent", "run", "--suite", "large",
               "--workloads", workload, "--variants", *variants, "--repeats", str(repeats),
               "--device", device, "--output", output, "--timeout", "3600"]
        started = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - started
        if proc.returncode != 0:
            sys.exit(f"{workload}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
        with open(output, encoding="utf-8") as f:
            results = json.load(f)["results"]
    compute = sum(sum(r.get("wall_s_repeats", [])) for r in results)
    return wall, compute, [f"{r['variant']} {r['status']}" for r in results]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="+", default=["default"])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    print(f"large suite, variants {' '.join(args.variants)}, repeats {args.repeats}, "
          f"device {args.device}")
    print(f"{'workload':<13} {'wall s':>7} {'compute':>8} {'rest':>6} {'GFLOP':>7} "
          f"{'A100 ms fp32/tf32/16-bit':>25}  statuses")
    totals = [0.0, 0.0, 0.0]
    for name, size in _sizes.LARGE.items():
        wall, compute, statuses = run_workload(name, args.variants, args.repeats, args.device)
        flops = size.flops()
        a100 = [_sizes.a100_seconds(flops, v) * 1e3
                for v in ("default", "tf32", "bf16-autocast")]
        totals = [totals[0] + wall, totals[1] + compute, totals[2] + flops]
        print(f"{name:<13} {wall:>7.1f} {compute:>8.1f} {wall - compute:>6.1f} "
              f"{flops / 1e9:>7.1f} {' / '.join(f'{t:.1f}' for t in a100):>25}  "
              f"{', '.join(statuses)}", flush=True)
    print(f"{'total':<13} {totals[0]:>7.1f} {totals[1]:>8.1f} {totals[0] - totals[1]:>6.1f} "
          f"{totals[2] / 1e9:>7.1f}")


if __name__ == "__main__":
    main()
