"""Variant overhead with and without the fork server (design §2.3; issue 42, item 7).
Not run by CI.

    .venv/bin/python bench/forkserver.py [--workloads mlp] [--variants V ...]
        [--repeats 1] [--fake-gpus N] [--rounds 1]

Runs the agent's CLI (`numparity-agent run`) on the same workloads and variants twice
per round: with `--fresh-interpreters` (before: each variant child a fresh interpreter
that imports torch) and without (after: each forked from one server that imported torch
once). For each it prints the document's timeline (one line per child: its phases and
its overhead, wall less the workloads' `run`, per variant; bench/agent.py's table), then
before/after: the overhead per variant (mean and worst over the children), the first
child's apart (it waits for the server's import, as a fresh child waits for its own),
the `import` phase per child, and the run's wall time.

Target (design §4): overhead per variant <= 3 s on a GPU. On a CPU (or fake GPUs, which
compute on this CPU) the figures are this machine's, under its load (printed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import agent as agent_bench  # noqa: E402 - bench/agent.py, beside this file

TARGET_VARIANT_OVERHEAD_S = agent_bench.TARGET_VARIANT_OVERHEAD_S


def run(args: argparse.Namespace, *, fresh: bool, output: str) -> tuple[float, dict[str, Any]]:
    cmd = [sys.executable, "-m", "numparity_agent", "run", "--workloads", *args.workloads,
           "--variants", *args.variants, "--repeats", str(args.repeats), "--node", "bench",
           "--output", output, *(["--fresh-interpreters"] if fresh else [])]
    env = agent_bench.fake_gpu_env(args.fake_gpus) if args.fake_gpus else None
    start = time.perf_counter()
    done = subprocess.run(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                          check=False, env=env)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        print(done.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"the agent exited with {done.returncode}")
    for line in done.stderr.splitlines():
        if "fresh interpreter" in line:
            print(f"  agent: {line}")
    with open(output, encoding="utf-8") as f:
        return wall, json.load(f)


def overheads(document: dict[str, Any]) -> tuple[list[float], list[float]]:
    """(overhead per variant of each child, import seconds of each child), in order."""
    per_variant, imports = [], []
    for child in document.get("timeline") or []:
        phases = child.get("phases", {})
        per_variant.append((child["wall_s"] - phases.get("run_s", 0.0))
                           / max(len(child["variants"]), 1))
        imports.append(phases.get("import_s", 0.0))
    return per_variant, imports


def summary(label: str, walls: list[float], per_variant: list[float],
            imports: list[float], firsts: list[float], later: list[float]) -> None:
    later = later or per_variant
    print(f"  {label:<7} run {statistics.mean(walls):7.2f} s | overhead per variant: mean "
          f"{statistics.mean(per_variant):6.2f} s, worst {max(per_variant):6.2f} s, first "
          f"child {statistics.mean(firsts):6.2f} s, later children mean "
          f"{statistics.mean(later):6.2f} s | import per child: mean "
          f"{statistics.mean(imports):6.2f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=["mlp"])
    parser.add_argument("--variants", nargs="+",
                        default=["default", "strict", "tf32", "fp64-reference"])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--fake-gpus", type=int, default=0, metavar="N")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start; "
          f"workloads {', '.join(args.workloads)}; variants {', '.join(args.variants)}; "
          f"{args.fake_gpus or 'no'} fake GPU(s); {args.rounds} round(s)")
    figures: dict[bool, dict[str, list[float]]] = {
        fresh: {"walls": [], "per_variant": [], "imports": [], "firsts": [], "later": []}
        for fresh in (True, False)}
    with tempfile.TemporaryDirectory(prefix="numparity-bench-") as tmp:
        for round_ in range(args.rounds):
            for fresh in (True, False):
                label = "before (fresh interpreters)" if fresh else "after (fork server)"
                print(f"\n== round {round_ + 1}, {label}")
                wall, document = run(args, fresh=fresh, output=os.path.join(tmp, "doc.json"))
                agent_bench.print_timeline(document)
                per_variant, imports = overheads(document)
                got = figures[fresh]
                got["walls"].append(wall)
                got["per_variant"] += per_variant
                got["imports"] += imports
                got["firsts"].append(per_variant[0])
                got["later"] += per_variant[1:]
    print(f"\n== before / after (load average {os.getloadavg()[0]:.1f} at the end)")
    for fresh, label in ((True, "before"), (False, "after")):
        got = figures[fresh]
        summary(label, got["walls"], got["per_variant"], got["imports"], got["firsts"],
                got["later"])
    worst = max(figures[False]["per_variant"])
    print(f"== after: worst overhead per variant {worst:.2f} s (target <= "
          f"{TARGET_VARIANT_OVERHEAD_S:.0f} s on a GPU: "
          f"{agent_bench.verdict(worst <= TARGET_VARIANT_OVERHEAD_S)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
