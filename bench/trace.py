"""Op trace benchmark (design §2.10): what `run --trace-ops` costs. Not run by CI.

    .venv/bin/python bench/trace.py [--pairs 3] [--repeats 2]

1. Wall time: the whole standard suite (every workload, every variant) through the real
   CLI with and without `--trace-ops`, alternating, `--pairs` times; each pair's ratio
   (traced / plain) is printed, then the median ratio: the machine's noise hits both
   runs of a pair alike.
2. Size on a new environment: the gzip size (level 6, as uploads) of each distinct trace
   body and the traced bytes per traced result (all bodies / results that carry one).
3. A steady node: the traced document is uploaded to a real server (SQLite, temporary
   folder) by the agent's own upload code, then the next run of the same node, and a
   run of a second node with the same environment but no memory of the server: the
   trace bytes each upload carried (the bodies in the request).

Targets (issue 14): traced / plain ≤ 1.30; ≤ 8 KiB gzip per traced result on a new
environment; 0 bytes of traces from a steady node.
"""

from __future__ import annotations

import argparse
import copy
import gzip
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ingest import running_server  # noqa: E402

from numparity_agent.testing import (  # noqa: E402
    RUNS_PATH,
    KnownManifests,
    builtin_workloads,
    upload_document,
    variant_names,
)

TARGET_RATIO = 1.30
TARGET_BYTES = 8 * 1024


def run_suite(output: Path, *, traced: bool, repeats: int) -> float:
    cmd = [sys.executable, "-m", "numparity_agent", "run", "--workloads",
           *builtin_workloads(), "--variants", *variant_names(), "--repeats", str(repeats),
           "--device", "cpu", "--node", "bench", "--output", str(output)]
    if traced:
        cmd.append("--trace-ops")
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"agent failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return seconds


def trace_sizes(document: dict[str, Any]) -> tuple[list[int], int]:
    """(gzip bytes of each distinct body, results that carry a trace)."""
    bodies = [len(gzip.compress(json.dumps(body, separators=(",", ":")).encode(), 6))
              for body in document.get("traces") or []]
    traced = sum(1 for r in document["results"] if isinstance(r.get("trace"), str))
    return bodies, traced


class _Counting:
    """An httpx event hook that adds up the trace bodies of each runs upload."""

    def __init__(self) -> None:
        self.trace_bytes: list[int] = []

    def __call__(self, request: httpx.Request) -> None:
        if not request.url.path.endswith(RUNS_PATH):
            return
        body = json.loads(gzip.decompress(request.content))
        self.trace_bytes.append(sum(
            len(gzip.compress(json.dumps(b, separators=(",", ":")).encode(), 6))
            for b in body.get("traces") or []))


def steady(document: dict[str, Any], workdir: Path) -> list[tuple[str, int]]:
    """Trace bytes of: the first upload, the same node's next run, another node's run."""
    figures = []
    with running_server(f"sqlite:///{workdir / 'bench.db'}", 1, workdir / "server.log") as server:
        spools = {"bench": KnownManifests(workdir / "known-a.json", server.base_url),
                  "bench-2": KnownManifests(workdir / "known-b.json", server.base_url)}
        for label, node in (("first upload (new environment)", "bench"),
                            ("the same node's next run", "bench"),
                            ("another node, same environment, no memory", "bench-2")):
            run = copy.deepcopy(document)
            run["run_id"] = str(uuid.uuid4())
            run["node"]["name"] = node
            counting = _Counting()
            with httpx.Client(timeout=60, event_hooks={"request": [counting]}) as client:
                answer = upload_document(run, server=server.base_url, token=server.token,
                                         client=client, known=spools[node])
            if not answer.ok:
                raise SystemExit(f"upload refused: {answer.status} {answer.detail[:500]}")
            figures.append((label, sum(counting.trace_bytes)))
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="numparity-bench-trace-") as tmp:
        workdir = Path(tmp)
        ratios, plain_s, traced_s = [], [], []
        for pair in range(args.pairs):
            plain = run_suite(workdir / "plain.json", traced=False, repeats=args.repeats)
            traced = run_suite(workdir / "traced.json", traced=True, repeats=args.repeats)
            plain_s.append(plain)
            traced_s.append(traced)
            ratios.append(traced / plain)
            print(f"pair {pair + 1}: plain {plain:.1f} s, traced {traced:.1f} s, "
                  f"ratio {traced / plain:.2f}", flush=True)
        ratio = statistics.median(ratios)
        print(f"suite wall time: plain median {statistics.median(plain_s):.1f} s, traced "
              f"median {statistics.median(traced_s):.1f} s; traced/plain median {ratio:.2f} "
              f"(target <= {TARGET_RATIO:.2f}) {'ok' if ratio <= TARGET_RATIO else 'OVER'}")
        document = json.loads((workdir / "traced.json").read_text())
        bodies, traced_results = trace_sizes(document)
        per_result = sum(bodies) / max(traced_results, 1)
        print(f"traces on a new environment: {len(bodies)} distinct bodies for "
              f"{traced_results} traced results, gzip {min(bodies)}-{max(bodies)} B each, "
              f"{sum(bodies)} B in all = {per_result:.0f} B per traced result; largest "
              f"body {max(bodies) / 1024:.1f} KiB (target <= {TARGET_BYTES // 1024} KiB) "
              f"{'ok' if max(bodies) <= TARGET_BYTES else 'OVER'}")
        ops = [len(body["ops"]) for body in document["traces"]]
        print(f"ops per trace: {min(ops)}-{max(ops)}, {sum(ops)} in all")
        for label, sent in steady(document, workdir):
            print(f"trace bytes uploaded, {label}: {sent}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
