"""Compiled numerics benchmark (design §2.14, §4): what torch.compile (Inductor) costs
and changes on this machine, workload by workload. Not run by CI.

    .venv/bin/python bench/compiled.py [--workloads mlp cnn …] [--repeats 2]
                                       [--cache DIR] [--keep DIR]

Two agent runs of `--variants default compiled` (the real CLI, `--output`), both with
the same Inductor cache folder (a new, empty one unless `--cache`): the first compiles
cold, the second — a new process — from the cache the first filled. Per workload: the
cold compile (first run, first repeat), the warm compile in a new process (second run,
first repeat) and in the same process (first run, second repeat; dynamo's frames
forgotten), eager and compiled run time (`wall_s`: the repeats after the first), and the
compiled result against eager under the default tolerances (`analysis.compare_manifests`
and `result_verdict`, what `/runs/{run_id}/compiled` says; tensors over 4,096 elements
are judged from their sample and sketch here, without a server to hold their values),
its first divergent layer and the module localisation found. Then how many results are
identical, equivalent and divergent, and the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from numparity_server.analysis import (
    compare_manifests,
    fingerprint_from_wire,
    first_divergent_layer,
)
from numparity_server.analysis.verdicts import result_verdict

# The standard workloads that compile (the others are skipped under compiled: no model).
WORKLOADS = ("mlp", "cnn", "transformer", "lstm", "train", "decoder")


def run(workloads: list[str], repeats: int, cache: Path, out: Path) -> tuple[dict[str, Any],
                                                                             float]:
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "numparity_agent", "run", "--workloads", *workloads,
         "--variants", "default", "compiled", "--repeats", str(repeats), "--compile-cache",
         str(cache), "--timeout", "7200", "--output", str(out)],
        env=env, capture_output=True, text=True, timeout=4 * 7200, check=False)
    if not out.exists():
        raise SystemExit(f"the agent wrote no document (exit {done.returncode}):\n"
                         f"{done.stderr[-3000:]}")
    return json.loads(out.read_text()), time.monotonic() - started


def result(document: dict[str, Any], workload: str, variant: str) -> dict[str, Any]:
    return next(r for r in document["results"]
                if r["workload"] == workload and r["variant"] == variant)


def against_eager(compiled: dict[str, Any], eager: dict[str, Any]) -> tuple[str, str | None]:
    """(the result verdict, the first divergent layer) of compiled against eager."""
    fingerprints = {t["hash"]: fingerprint_from_wire(t)
                    for r in (compiled, eager) for t in r["tensors"]}
    manifest = [(t["name"], t["kind"], t["hash"]) for t in sorted(eager["tensors"],
                                                                   key=lambda t: t["order"])]
    candidate = [(t["name"], t["kind"], t["hash"]) for t in compiled["tensors"]]
    rows = compare_manifests(candidate, manifest, fingerprints)
    decided = result_verdict(rows)
    first = first_divergent_layer([r for r in rows if r["kind"] == "layer"])
    return (decided.verdict if decided else "no tensors"), (first or {}).get("name")


def seconds(value: Any) -> str:
    return f"{value:.1f}" if isinstance(value, int | float) else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--cache", type=Path, help="Inductor's cache folder (default: a new "
                        "empty one, so the first run compiles cold)")
    parser.add_argument("--keep", type=Path, help="keep the two run documents here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="numparity-compiled-") as folder:
        work = args.keep or Path(folder)
        work.mkdir(parents=True, exist_ok=True)
        cache = args.cache or work / "inductor"
        cold, cold_wall = run(args.workloads, args.repeats, cache, work / "cold.json")
        warm, warm_wall = run(args.workloads, args.repeats, cache, work / "warm.json")
    torch_version = cold["environment"].get("torch", {}).get("version")
    print(f"torch {torch_version}, {os.cpu_count()} CPUs, Inductor cache {cache}; "
          f"agent runs: cold {cold_wall:.0f} s, warm {warm_wall:.0f} s")
    print(f"{'workload':<12} {'cold s':>7} {'warm s':>7} {'same-proc':>9} {'eager s':>8} "
          f"{'compiled s':>10} {'ratio':>6}  {'vs eager':<11} {'first layer':<22} localised")
    counts: dict[str, int] = {}
    for workload in args.workloads:
        first = result(cold, workload, "compiled")
        if first["status"] != "ok":
            print(f"{workload:<12} {first['status']}: "
                  f"{(first.get('reason') or first.get('error') or '').splitlines()[0]}")
            counts[first["status"]] = counts.get(first["status"], 0) + 1
            continue
        eager = result(cold, workload, "default")
        again = result(warm, workload, "compiled")
        passes = first["compile"]["passes"]
        warm_pass = again["compile"]["passes"][0]
        verdict, layer = against_eager(first, eager)
        counts[verdict] = counts.get(verdict, 0) + 1
        located = first.get("localisation") or {}
        ratio = first["wall_s"] / eager["wall_s"] if eager.get("wall_s") else float("nan")
        where = "-" if located.get("eager_identical") else (
            located.get("module") or (located.get("note") or located.get("error") or "-")[:40])
        print(f"{workload:<12} {seconds(passes[0]['seconds']):>7} "
              f"{seconds(warm_pass['seconds']):>7} "
              f"{seconds(passes[1]['seconds'] if len(passes) > 1 else None):>9} "
              f"{eager['wall_s']:>8.4f} {first['wall_s']:>10.4f} {ratio:>6.2f}  "
              f"{verdict:<11} {layer or '-':<22} {where}")
        print(f"{'':<12} cache: cold pass {passes[0]['cache_misses']} miss(es) "
              f"{passes[0]['cache_hits']} hit(s); new process {warm_pass['cache_misses']} "
              f"miss(es) {warm_pass['cache_hits']} hit(s); graphs {passes[0]['graphs']}"
              + (f"; kernels {', '.join(located.get('kernels', [])[:3])}"
                 if located.get("kernels") else ""))
    print("results against eager: " + ", ".join(f"{n} {v}" for v, n in sorted(counts.items())))
    print(f"load average at the end: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
