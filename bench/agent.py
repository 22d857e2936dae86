"""Agent benchmark: the whole standard suite through the real CLI. Not run by CI.

    .venv/bin/python bench/agent.py [--repeats 2] [--device all] [--keep FILE]

1. Runs ``python -m numparity_agent run --output FILE`` with every registered workload
   and every registered variant (names read from the registries, so new ones are
   included; variants that cannot run here are reported as skipped by the agent) on
   the agent's devices (default: every visible GPU, else the CPU) and prints:
   - wall time of the whole run (the CLI process, start to exit: listing the devices,
     then every device);
   - per device: the document's ``devices[].wall_s`` (every variant child of that
     device, one after another), the figure the suite's target applies to;
   - per device and variant: the time between the agent's "variant X: running" log
     lines, read as they arrive (child start, torch import, environment capture, every
     workload with its repeats and its fingerprints);
   - per device and workload: the document's ``wall_s`` (mean of one run, building and
     fingerprinting excluded) for each variant;
   - peak RSS of the children: ``getrusage(RUSAGE_CHILDREN).ru_maxrss`` after the
     CLI exits (the largest of the CLI and its variant children, which it waits for).
2. Fingerprint overhead, measured through the agent's own code path: for each variant,
   one child process (with the variant's environment, as the agent's own child) calls
   ``numparity_agent.testing.run_child`` -- the function the agent's child runs, so
   ``_runner.run_workload`` with everything it adds (knobs, workload fields, repeat
   checks) -- after wrapping, with timers, the names the runner calls: ``fingerprint``
   (every recorded tensor of the first repeat), ``tensor_hashes`` (later repeats) and
   ``combined_hash`` (inputs and parameters, each repeat). Run time is the runner's own
   ``wall_s_repeats`` (``workload.run`` inside the variant's run context). Overhead =
   fingerprint time / run time, over the whole suite and per workload. The profiled
   tensor hashes are checked against the CLI's document (same path, same numbers).
   The profile runs on the run's first device.

Targets (design §2.2): suite <= 60 s per device, fingerprint overhead <= 10 %, peak RSS
<= 1.5 GiB.
"""

from __future__ import annotations

import argparse
import json
import os
import re
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
# "cuda:1 variant strict: running cnn, …" (several devices) or "variant strict: running
# cnn, … on cpu" (one).
RUNNING = re.compile(r"numparity-agent: (?:(\S+) )?variant (\S+): running .*?(?: on (\S+))?$")


def run_cli(
    workloads: list[str], variants: list[str], repeats: int, device: str, output: str
) -> tuple[float, dict[tuple[str, str], float], list[str], int]:
    """(run wall s, wall s per (device, variant), log lines, return code) of one CLI
    run. A variant's time ends where the next starts: the last one of a device also
    counts the device's closing line, the last of the run the document's writing."""
    cmd = [
        sys.executable,
        "-m",
        "numparity_agent",
        "run",
        "--workloads",
        *workloads,
        "--variants",
        *variants,
        "--repeats",
        str(repeats),
        "--device",
        device,
        "--node",
        "bench",
        "--output",
        output,
    ]
    marks: list[tuple[float, tuple[str, str]]] = []
    lines: list[str] = []
    start = time.perf_counter()
    with subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True) as p:
        assert p.stderr is not None
        for line in p.stderr:
            now = time.perf_counter()
            lines.append(line.rstrip("\n"))
            running = RUNNING.search(line.rstrip("\n"))
            if running:
                device = running.group(1) or running.group(3)
                marks.append((now, (device, running.group(2))))
        code = p.wait()
    end = time.perf_counter()
    per_variant: dict[tuple[str, str], float] = {}
    for i, (t, key) in enumerate(marks):
        t_next = marks[i + 1][0] if i + 1 < len(marks) else end
        per_variant[key] = t_next - t
    return end - start, per_variant, lines, code


PROFILE_CHILD = r"""
import json, sys, time
from numparity_agent import _runner  # its module globals are wrapped below, in place
from numparity_agent.testing import run_child

spec = json.loads(sys.argv[1])
timers = {}  # workload -> {"fingerprint_s", "calls"}
current = {"workload": None}


def timed(fn):
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            acc = timers.setdefault(current["workload"], {"fingerprint_s": 0.0, "calls": 0})
            acc["fingerprint_s"] += time.perf_counter() - start
            acc["calls"] += 1
    return wrapper


def tracked(fn):
    def wrapper(workload, **kwargs):
        current["workload"] = workload.name
        start = time.perf_counter()
        result = fn(workload, **kwargs)
        acc = timers.setdefault(workload.name, {"fingerprint_s": 0.0, "calls": 0})
        acc["total_s"] = time.perf_counter() - start
        return result
    return wrapper


# The names the runner calls (it imported them from _fingerprint); combined_hash's own
# hashing goes through _fingerprint's globals, so nothing is counted twice.
for name in ("fingerprint", "tensor_hash", "tensor_hashes", "combined_hash"):
    if hasattr(_runner, name):
        setattr(_runner, name, timed(getattr(_runner, name)))
_runner.run_workload = tracked(_runner.run_workload)
output = run_child(spec)
out = {"results": output["results"], "timers": timers}
print(json.dumps(out))
"""


def profile_variant(
    variant: str, workloads: list[str], repeats: int, device: str
) -> dict[str, Any]:
    from numparity_agent.testing import numeric_env_vars
    from numparity_agent.testing import variant as variant_named

    env = variant_named(variant).child_env(dict(os.environ))
    spec = {
        "variant": variant,
        "workloads": workloads,
        "repeats": repeats,
        "device": device,
        "node_env_vars": numeric_env_vars(),
    }
    proc = subprocess.run(
        [sys.executable, "-c", PROFILE_CHILD, json.dumps(spec)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr else "failed"}
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def document_hashes(result: dict[str, Any]) -> list[tuple[str, str]]:
    return [(t["name"], t["hash"]) for t in result.get("tensors", [])]


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
    args = parser.parse_args()

    workloads = builtin_workloads()
    variants = variant_names()
    print(f"workloads ({len(workloads)}): {', '.join(workloads)}")
    print(f"variants  ({len(variants)}): {', '.join(variants)}")
    print(f"repeats {args.repeats}, device {args.device}, python {sys.executable}")
    print()

    with tempfile.TemporaryDirectory(prefix="numparity-bench-") as tmp:
        output = args.keep or os.path.join(tmp, "run.json")
        total_s, per_variant_s, lines, code = run_cli(
            workloads, variants, args.repeats, args.device, output
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
        print(f"{slot}, per variant (child process wall, from the agent's log lines):")
        for variant in ran:
            statuses = [r["status"] for r in mine if r["variant"] == variant]
            skipped = [r for r in mine if r["variant"] == variant and r["status"] == "skipped"]
            note = f"  skipped: {skipped[0].get('reason')}" if skipped else ""
            counts = ", ".join(f"{statuses.count(s)} {s}" for s in sorted(set(statuses)))
            wall = per_variant_s.get((slot, variant), float("nan"))
            print(f"  {variant:<16} {wall:7.2f} s  ({counts}){note}")
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

    print(
        "fingerprint overhead, measured through the agent's own code path: per variant one "
        "child (the variant's environment) runs numparity_agent.testing.run_child, as the "
        "agent's child does, with the runner's fingerprint/tensor_hashes/combined_hash "
        "wrapped by timers; run time = the runner's own wall_s_repeats (workload.run "
        "inside the variant's run context); overhead = time in those calls / run time"
    )
    first = devices[0]["device"]
    print(f"  on {first}")
    cli_results = {(r["device"], r["workload"], r["variant"]): r for r in results}
    fp_total = run_total = 0.0
    per_workload: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0])
    mismatched: list[str] = []
    for variant in variants:
        profile = profile_variant(variant, workloads, args.repeats, first)
        if profile.get("error"):
            print(f"  {variant:<16} error: {profile['error']}")
            continue
        ok = [r for r in profile["results"] if r["status"] == "ok"]
        if not ok:
            print(f"  {variant:<16} {profile['results'][0]['status']}")
            continue
        v_fp = v_run = 0.0
        for r in ok:
            timer = profile["timers"].get(r["workload"], {})
            w_fp, w_run = timer.get("fingerprint_s", 0.0), sum(r["wall_s_repeats"])
            v_fp, v_run = v_fp + w_fp, v_run + w_run
            acc = per_workload[r["workload"]]
            acc[0] += w_fp
            acc[1] += w_run
            acc[2] += timer.get("total_s", 0.0)
            acc[3] = len(r["tensors"])
            # Same code path, same numbers: the profiled hashes are the CLI's.
            cli = cli_results.get((r["device"], r["workload"], variant))
            if cli is not None and document_hashes(cli) != document_hashes(r):
                mismatched.append(f"{r['workload']}/{variant}")
        fp_total, run_total = fp_total + v_fp, run_total + v_run
        print(
            f"  {variant:<16} fingerprint {v_fp:6.3f} s / workloads {v_run:6.3f} s "
            f"= {v_fp / v_run:6.1%}"
        )
    for name, (w_fp, w_run, w_total, tensors) in per_workload.items():
        print(
            f"    {name:<12} {tensors:4d} tensors  fingerprint {w_fp:6.3f} s / "
            f"run {w_run:6.3f} s = {w_fp / w_run if w_run else float('nan'):7.1%}  "
            f"(run_workload total {w_total:6.3f} s)"
        )
    print(
        "  tensor hashes of the profiled runs vs the CLI's document: "
        + (f"DIFFER for {', '.join(mismatched)}" if mismatched else "identical")
    )
    if run_total:
        overhead = fp_total / run_total
        print(
            f"== fingerprint overhead, whole suite: {fp_total:.3f} s / {run_total:.3f} s = "
            f"{overhead:.1%} (target <= {TARGET_OVERHEAD:.0%}: "
            f"{verdict(overhead <= TARGET_OVERHEAD)})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
