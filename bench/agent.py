"""Agent benchmark: the whole standard suite through the real CLI. Not run by CI.

    .venv/bin/python bench/agent.py [--repeats 2] [--device all] [--keep FILE]
        [--fake-gpus N] [--workloads W ...] [--variants V ...]

1. Runs ``python -m numparity_agent run --output FILE`` with every registered workload
   and every registered variant (names read from the registries, so new ones are
   included; variants that cannot run here are reported as skipped by the agent) on
   the agent's devices (default: every visible GPU, else the CPU) and prints:
   - wall time of the whole run (the CLI process, start to exit: listing the devices,
     then every device);
   - per device: the document's ``devices[].wall_s`` (every variant child of that
     device, one after another), the figure the suite's target applies to;
   - per device and variant: its results' statuses (and why one is skipped);
   - per device and workload: the document's ``wall_s`` (mean of one run, building and
     fingerprinting excluded) for each variant;
   - peak RSS of the children: ``getrusage(RUSAGE_CHILDREN).ru_maxrss`` after the
     CLI exits (the largest of the CLI and its variant children, which it waits for).
2. Where each variant's time goes, from the document's own `timeline` (design §2.7):
   per child process (one per variant, or several variants that set nothing
   process-wide sharing one) its phases -- start, import, device_init, environment,
   build, run, fingerprint, trace, write, other -- and the overhead per variant: the
   child's wall time less its workloads' `run`, divided by the variants it ran.
3. Per device, its overhead (its children's wall less its workloads' runs), and the
   whole node's: the run against its slowest device (the devices run at once, design
   §2.6) and against their sum; `--fake-gpus N` runs it on N fake GPUs
   (tests/helpers/fake_cuda), each computing on this CPU with one thread.
4. Fingerprint overhead, measured by the agent itself in the same run: each result's
   `timeline.fingerprint_s` (hashing the built inputs and parameters of the first
   repeat, fingerprinting its recorded tensors, checking every later repeat against it
   bit for bit) over its `timeline.run_s` (``workload.run`` inside the variant's run
   context, every repeat), over the whole suite and per workload.

Targets (design §2.2, §4): suite <= 60 s per device, fingerprint overhead <= 10 %, peak
RSS <= 1.5 GiB, overhead per variant <= 3 s (on a GPU; printed on a CPU too).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from typing import Any

TARGET_SUITE_S = 60.0
TARGET_OVERHEAD = 0.10
TARGET_RSS_BYTES = 1.5 * 2**30
TARGET_VARIANT_OVERHEAD_S = 3.0
# "cuda:1 variant strict: running cnn, …" (several devices) or "variant strict: running
# cnn, … on cpu" (one).


FAKE_CUDA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                         "tests", "helpers", "fake_cuda")


def fake_gpu_env(count: int) -> dict[str, str]:
    """The agent's environment on a node of `count` fake GPUs (tests/helpers/fake_cuda:
    each computes on this CPU, with one thread)."""
    gpus = [{"uuid": f"GPU-00000000-0000-4000-8000-{n:012x}", "serial": f"13202210{n:05d}",
             "pci_bus_id": f"00000000:{7 + n:02X}:00.0", "name": "NVIDIA H200 (fake)",
             "cc": "9.0", "threads": 1} for n in range(count)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [FAKE_CUDA, env.get("PYTHONPATH")]))
    env["NUMPARITY_TEST_FAKE_GPUS"] = json.dumps(gpus)
    return env


def run_cli(
    workloads: list[str], variants: list[str], repeats: int, device: str, output: str,
    env: dict[str, str] | None = None,
) -> tuple[float, list[str], int]:
    """(run wall s, log lines, return code) of one CLI run."""
    cmd = [sys.executable, "-m", "numparity_agent", "run", "--workloads", *workloads,
           "--variants", *variants, "--repeats", str(repeats), "--device", device,
           "--node", "bench", "--output", output]
    start = time.perf_counter()
    done = subprocess.run(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                          check=False, env=env)
    return time.perf_counter() - start, done.stderr.splitlines(), done.returncode


def print_node(document: dict[str, Any], total_s: float) -> None:
    """Per-device overhead (its children's wall less its workloads' runs) and the whole
    node's: the run against its slowest device (the devices run at once) and against
    their sum (what one device after another would take)."""
    devices = [d for d in document["devices"] if d["type"] != "cpu"] or document["devices"]
    print("per device: wall (its children, one after another), runs (its workloads' "
          "run_s), overhead = wall - runs")
    for device in devices:
        runs = sum(r.get("timeline", {}).get("run_s", 0.0) for r in document["results"]
                   if r["device"] == device["device"] and r["status"] == "ok")
        print(f"  {device['device']:<8} wall {device['wall_s']:7.2f} s  runs {runs:7.2f} s  "
              f"overhead {device['wall_s'] - runs:7.2f} s")
    walls = [d["wall_s"] for d in devices]
    print(f"== whole node, {len(devices)} device(s): the run {total_s:.1f} s; slowest device "
          f"{max(walls):.1f} s; sum of devices {sum(walls):.1f} s; run / slowest "
          f"{total_s / max(max(walls), 1e-9):.2f}x (one device after another would be "
          f"{sum(walls) / max(max(walls), 1e-9):.2f}x)")


def print_timeline(document: dict[str, Any]) -> None:
    """Each child's phases and the overhead per variant (its wall less its runs)."""
    timeline = document.get("timeline") or []
    print("where the time goes: the document's timeline, one line per child process "
          "(seconds; overhead = wall - run, per variant)")
    phases = ["start", "import", "device_init", "environment", "build", "run",
              "fingerprint", "trace", "write", "other"]
    print(f"  {'device':<8}{'variants':<48}{'wall':>7}" + "".join(f"{p[:7]:>8}" for p in phases)
          + f"{'ovh/var':>9}")
    worst = 0.0
    for child in timeline:
        seen = child.get("phases", {})
        overhead = (child["wall_s"] - seen.get("run_s", 0.0)) / max(len(child["variants"]), 1)
        worst = max(worst, overhead)
        print(f"  {child['device']:<8}{', '.join(child['variants'])[:47]:<48}"
              f"{child['wall_s']:>7.2f}" + "".join(f"{seen.get(p + '_s', 0.0):>8.2f}"
                                                   for p in phases) + f"{overhead:>9.2f}")
    if timeline:
        print(f"== overhead per variant, worst child: {worst:.2f} s (target <= "
              f"{TARGET_VARIANT_OVERHEAD_S:.0f} s on a GPU: "
              f"{verdict(worst <= TARGET_VARIANT_OVERHEAD_S)})")


def print_fingerprint_overhead(results: list[dict[str, Any]]) -> None:
    """fingerprint_s / run_s from each result's timeline: per variant, per workload,
    whole suite."""
    print("fingerprint overhead, from the agent's own timeline of this run: "
          "fingerprint_s (input/param hashes, the first repeat's fingerprints, the later "
          "repeats' bitwise checks) / run_s (workload.run, every repeat)")
    ok = [r for r in results if r["status"] == "ok" and "timeline" in r]
    by_variant: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    by_workload: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for r in ok:
        fp, run = r["timeline"].get("fingerprint_s", 0.0), r["timeline"].get("run_s", 0.0)
        key = f"{r['device']} {r['variant']}"
        by_variant[key][0] += fp
        by_variant[key][1] += run
        acc = by_workload[r["workload"]]
        acc[0] += fp
        acc[1] += run
        acc[2] = len(r["tensors"])
    for key, (fp, run) in by_variant.items():
        print(f"  {key:<24} fingerprint {fp:6.3f} s / workloads {run:6.3f} s = "
              f"{fp / run if run else float('nan'):6.1%}")
    for name, (fp, run, tensors) in by_workload.items():
        print(f"    {name:<12} {int(tensors):4d} tensors  fingerprint {fp:6.3f} s / "
              f"run {run:6.3f} s = {fp / run if run else float('nan'):7.1%}")
    fp_total = sum(fp for fp, _ in by_variant.values())
    run_total = sum(run for _, run in by_variant.values())
    if run_total:
        overhead = fp_total / run_total
        print(f"== fingerprint overhead, whole suite: {fp_total:.3f} s / {run_total:.3f} s = "
              f"{overhead:.1%} (target <= {TARGET_OVERHEAD:.0%}: "
              f"{verdict(overhead <= TARGET_OVERHEAD)})")


def verdict(ok: bool) -> str:
    return "ok" if ok else "OVER TARGET"


def main() -> int:
    from numparity_agent.testing import builtin_workloads, variant_names

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2, help="as the agent (default 2)")
    parser.add_argument("--device", default="all",
                        help="as the agent's --device (default all: every visible GPU, "
                        "else the CPU)")
    parser.add_argument("--keep", help="also keep the run document here")
    parser.add_argument("--fake-gpus", type=int, default=0, metavar="N",
                        help="a node of N fake GPUs (tests/helpers/fake_cuda), each on this "
                        "CPU: the per-device and whole-node overhead of running them at once")
    parser.add_argument("--workloads", nargs="+", help="only these (default every one)")
    parser.add_argument("--variants", nargs="+", help="only these (default every one)")
    args = parser.parse_args()

    workloads = args.workloads or builtin_workloads()
    variants = args.variants or variant_names()
    print(f"workloads ({len(workloads)}): {', '.join(workloads)}")
    print(f"variants  ({len(variants)}): {', '.join(variants)}")
    print(f"repeats {args.repeats}, device {args.device}, python {sys.executable}")
    print()

    with tempfile.TemporaryDirectory(prefix="numparity-bench-") as tmp:
        output = args.keep or os.path.join(tmp, "run.json")
        total_s, lines, code = run_cli(
            workloads, variants, args.repeats, args.device, output,
            env=fake_gpu_env(args.fake_gpus) if args.fake_gpus else None,
        )
        peak_rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # KiB
        if code != 0 or not os.path.exists(output):
            print(f"agent exited with code {code}")
            print("\n".join(lines[-20:]))
            if not os.path.exists(output):
                return 1
        with open(output, encoding="utf-8") as f:
            document = json.load(f)

    results = document["results"]
    devices = document["devices"]
    print(f"== the whole run through the CLI: {total_s:.1f} s, exit code {code}")
    for device in devices:
        print(
            f"== suite on {device['device']} ({device['name']}): {device['wall_s']:.1f} s "
            f"(target <= {TARGET_SUITE_S:.0f} s per device: "
            f"{verdict(device['wall_s'] <= TARGET_SUITE_S)}), {device['status']}"
        )
    print(
        f"== peak RSS of the children: {peak_rss / 2**20:.0f} MiB "
        f"(target <= {TARGET_RSS_BYTES / 2**30:.1f} GiB: "
        f"{verdict(peak_rss <= TARGET_RSS_BYTES)})"
    )
    for device in devices:
        slot = device["device"]
        mine = [r for r in results if r["device"] == slot]
        ran = [v for v in variants if any(r["variant"] == v for r in mine)]
        print()
        print(f"{slot}, per variant:")
        for variant in ran:
            statuses = [r["status"] for r in mine if r["variant"] == variant]
            skipped = [r for r in mine if r["variant"] == variant and r["status"] == "skipped"]
            note = f"  skipped: {skipped[0].get('reason')}" if skipped else ""
            counts = ", ".join(f"{statuses.count(s)} {s}" for s in sorted(set(statuses)))
            print(f"  {variant:<16} ({counts}){note}")
        print(
            f"{slot}, per workload: wall_s from the document (one run: the median of "
            f"the {args.repeats} repeats after the first, a warm-up; building and "
            "fingerprinting excluded), by variant"
        )
        print(
            "  "
            + f"{'workload':<12}"
            + "".join(f"{v[:14]:>15}" for v in ran)
            + f"{'sum x repeats':>15}"
        )
        by_key = {(r["workload"], r["variant"]): r for r in mine}
        for workload in workloads:
            row, total = [], 0.0
            for variant in ran:
                r = by_key.get((workload, variant))
                if r is None or r["status"] != "ok":
                    row.append(f"{(r or {}).get('status', '-'):>15}")
                else:
                    row.append(f"{r['wall_s']:>15.4f}")
                    total += r["wall_s"] * r["repeats"]
            print(f"  {workload:<12}" + "".join(row) + f"{total:>15.3f}")
    failed = [r for r in results if r["status"] == "failed"]
    for r in failed:
        print(
            f"  FAILED {r['device']} {r['workload']}/{r['variant']}: "
            f"{r.get('error', '').strip().splitlines()[-1:]}"
        )
    disagree = [
        f"{r['device']} {r['workload']}/{r['variant']}"
        for r in results
        if r["status"] == "ok" and not r["repeats_agree"]
    ]
    print(f"  repeats disagree: {', '.join(disagree) or 'none'}")
    print()

    print_timeline(document)
    print()
    print_node(document, total_s)
    print()
    print_fingerprint_overhead(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
