"""`explain` benchmark (design §2.11): how long finding the setting of one split takes.
Not run by CI.

    .venv/bin/python bench/explain.py [--workloads mlp cnn transformer lstm train probes]

Starts a server (SQLite, temporary folder), uploads with the real agent one run per
split of this CPU (`MKL_CBWR=COMPATIBLE`, `OMP_NUM_THREADS=1`, `ATEN_CPU_CAPABILITY=
avx2`) and a fault drill (no setting reproduces a flipped bit: the bounded worst case),
then runs `numparity-agent explain --against` each of them from the stock environment
and, for the settings, back from the split's environment against a stock run. Prints
each explain's wall time (the CLI process, start to exit) and what it found.

Target (issue 14): one split's explain for the standard workloads <= 120 s.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ingest import running_server  # noqa: E402

TARGET_S = 120.0
SPLITS = {"mkl": {"MKL_CBWR": "COMPATIBLE"}, "1thread": {"OMP_NUM_THREADS": "1"},
          "avx2": {"ATEN_CPU_CAPABILITY": "avx2"}}
NUMERIC_PREFIXES = ("OMP_", "MKL_", "KMP_", "ATEN_CPU_CAPABILITY", "PYTORCH_", "NUMPARITY_")


def environ(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(NUMERIC_PREFIXES)}
    return {**env, **extra}


def agent(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "numparity_agent", *args], env=env,
                          capture_output=True, text=True, check=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", nargs="+",
                        default=["mlp", "cnn", "transformer", "lstm", "train", "probes"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="numparity-bench-explain-") as tmp:
        workdir = Path(tmp)
        with running_server(f"sqlite:///{workdir / 'bench.db'}", 1,
                            workdir / "server.log") as server:
            common = ["--server", server.base_url, "--token", server.token]
            run_ids = {}
            for name, extra in {"stock": {}, **SPLITS, "drill": {}}.items():
                out = workdir / f"{name}.json"
                drill = ["--fault-drill"] if name == "drill" else []
                proc = agent("run", *common, "--node", f"bench-{name}", "--workloads",
                             *args.workloads, "--variants", "default", "strict",
                             "--spool", str(workdir / f"spool-{name}"), "--output", str(out),
                             *drill, env=environ(**extra))
                if proc.returncode != 0:
                    raise SystemExit(f"run {name} failed:\n{proc.stderr[-2000:]}")
                run_ids[name] = json.loads(out.read_text())["run_id"]
            cases = [(f"stock against {name}", {}, name) for name in [*SPLITS, "drill"]]
            cases += [(f"{name} against stock", extra, "stock") for name, extra in SPLITS.items()]
            for label, extra, against in cases:
                started = time.perf_counter()
                proc = agent("explain", *common, "--node", "bench-stock", "--against",
                             run_ids[against], "--workloads", *args.workloads,
                             env=environ(**extra))
                seconds = time.perf_counter() - started
                verdict = "ok" if seconds <= TARGET_S else "OVER"
                print(f"{label}: {seconds:.1f} s (target <= {TARGET_S:.0f} s) {verdict}; "
                      f"exit {proc.returncode}")
                for line in proc.stdout.strip().splitlines():
                    print(f"    {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
