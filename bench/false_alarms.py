"""Proof of catch, false alarms (issue 44): how often an honest node is called wrong.

Not run by CI. Honest evaluations of `check`'s plan (its `strict` workloads, as
`bench/coverage.py` finds the server choosing them), on this CPU, under the noise a
node meets, in environments a lab runs:

- **conditions** (each its own environment, its own peers: a thread count or
  `OMP_DYNAMIC` is part of the env_key, so a node is compared with nodes configured as
  it is): the stock node, `OMP_DYNAMIC=true`, one thread (`OMP_NUM_THREADS=1`);
- **noise**: half of each condition's evaluations run beside a CPU burner (a process
  of float32 matrix products, as another job on the node), half without; the whole
  checks run at the same time as the in-process evaluations, each the other's load,
  beside whatever else the machine runs (its load average is recorded);
- **in-process evaluations**: a peer process computes the answer (the fleet's); a
  worker process then evaluates the plan `--evaluations` times (each workload built
  and run anew, as `check` computes it, its tensors hashed and compared with the
  peer's); every key compared is one evaluation of an answer, every pass over the
  plan one evaluation of the plan; each workload's first evaluation in a process is a
  warm-up, as in the agent's child (`Workload.warmup`);
- **fresh processes** (`--fresh`): a new interpreter computing the plan once, half beside
  the burner: what repeats inside one process never see (a first evaluation in a process
  that differs from every later one: measured, 1 % of fresh processes on `train` before
  the warm-up);
- **whole `check` invocations** (`--checks`): a live server (SQLite), three peers per
  condition uploading honest `run`s, then `numparity-agent check --json` under the
  condition, the burner on for half; and two honest runs of a further node per
  condition, after which the audit must name no suspect.

A false alarm is a no-go (exit 10, or a key that differs) or a suspect. With none in
N trials, the rule of three bounds the rate below 3/N at 95 % confidence. The figures
(count, conditions, result, wall time, load) go into `--figures FILE` (the file
`check --json` and the audit read: `agent/proof_of_catch.json`).

    .venv/bin/python bench/false_alarms.py [--quick] [--evaluations 2000] [--checks 100]
        [--fresh 300] [--figures agent/proof_of_catch.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

CONDITIONS: dict[str, dict[str, str]] = {
    "stock": {},
    "OMP_DYNAMIC=true": {"OMP_DYNAMIC": "true"},
    "OMP_NUM_THREADS=1": {"OMP_NUM_THREADS": "1"},
}
# The plan when the figures file names none (`bench/coverage.py` writes the one it
# measured the server choosing on this machine); `--plan` names another.
PLAN = ("train", "lstm", "mlp", "transformer", "cnn", "decoder")
FIGURES = HERE.parent / "agent" / "proof_of_catch.json"


def measured_plan() -> list[str]:
    try:
        plan = json.loads(FIGURES.read_text())["coverage"]["plan"]
    except (OSError, ValueError, KeyError, TypeError):
        return list(PLAN)
    return [str(w) for w in plan] or list(PLAN)
BURNER = """
import numpy as np, time, sys
a = np.random.default_rng(0).standard_normal((384, 384)).astype(np.float32)
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    a = np.tanh(a @ a)
"""


def node_env(condition: dict[str, str]) -> dict[str, str]:
    """This process's environment without its numeric variables, plus the condition's."""
    from numparity_agent.testing import numeric_env_vars

    own = numeric_env_vars()
    env = {k: v for k, v in os.environ.items() if k not in own}
    return {**env, **condition}


@contextmanager
def burner(on: bool, seconds: float = 3600) -> Any:
    """A process of matrix products beside the block (another job on the node)."""
    procs = [subprocess.Popen([sys.executable, "-c", BURNER, str(seconds)],
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
             for _ in range(1 if on else 0)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


# ---- the worker: one process computing the plan -----------------------------------------


_warm: set[str] = set()


def answers(plan: list[str]) -> dict[str, list[str]]:
    """The plan's strict answers, computed once in this process (a fresh build each), as
    the agent's child computes them: a workload's first evaluation in the process is a
    warm-up, not the answer (`Workload.warmup`, `_runner.run_workload`)."""
    import torch

    from numparity_agent._fingerprint import tensor_hashes
    from numparity_agent._workloads._base import Recorder
    from numparity_agent.testing import load_workload, variant

    strict = variant("strict")
    device = torch.device("cpu")
    found = {}
    for name in plan:
        workload = load_workload(name)
        if workload.warmup and name not in _warm:
            with strict.run_context(device):
                workload.run(workload.build(dtype=torch.float32, device=device), Recorder())
            _warm.add(name)
        built = workload.build(dtype=torch.float32, device=device)
        recorder = Recorder()
        with strict.run_context(device):
            workload.run(built, recorder)
        found[name] = tensor_hashes([t for _, _, t in recorder.tensors])
    return found


def worker(args: argparse.Namespace) -> int:
    import torch

    from numparity_agent.testing import variant

    variant("strict").apply(torch.device("cpu"), threads=torch.get_num_threads())
    plan = args.plan
    if args.worker == "peer":
        Path(args.out).write_text(json.dumps(answers(plan)))
        return 0
    if args.worker == "fresh":
        expected = json.loads(Path(args.reference).read_text())
        got = answers(plan)
        Path(args.out).write_text(json.dumps([n for n in plan if got[n] != expected[n]]))
        return 0
    expected = json.loads(Path(args.reference).read_text())
    differing: list[str] = []
    evaluations = keys = 0
    started = time.monotonic()
    while evaluations < args.evaluations and time.monotonic() - started < args.seconds:
        got = answers(plan)
        evaluations += 1
        for name in plan:
            keys += 1
            if got[name] != expected[name]:
                differing.append(name)
    Path(args.out).write_text(json.dumps({
        "evaluations": evaluations, "keys": keys, "differing": differing,
        "seconds": round(time.monotonic() - started, 1),
        "threads": torch.get_num_threads()}))
    return 0


def run_worker(kind: str, env: dict[str, str], plan: list[str], out: Path,
               reference: Path | None = None, evaluations: int = 0,
               seconds: float = 0) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--worker", kind, "--out", str(out), "--plan", *plan]
    if reference is not None:
        cmd += ["--reference", str(reference), "--count", str(evaluations),
                "--seconds", str(seconds)]
    subprocess.run(cmd, env=env, check=True)
    loaded: dict[str, Any] = json.loads(out.read_text())
    return loaded


def fresh_processes(plan: list[str], count: int, env: dict[str, str], reference: Path,
                    tmp: Path) -> dict[str, Any]:
    """`count` fresh interpreters, each computing the plan once as a `check` child does
    (a workload's first evaluation in a process can differ from every later one: what
    repeats inside one process never see), half beside the burner."""
    differing: list[str] = []
    for index in range(count):
        out = tmp / "fresh.json"
        with burner(index % 2 == 1):
            subprocess.run([sys.executable, __file__, "--worker", "fresh", "--out", str(out),
                            "--reference", str(reference), "--plan", *plan], env=env,
                           check=True)
        differing.extend(json.loads(out.read_text()))
    return {"processes": count, "differing": differing}


def in_process(plan: list[str], evaluations: int, seconds: float, tmp: Path,
               fresh: int = 0) -> dict[str, Any]:
    """Per condition: a peer's answer, then `evaluations` (in at most `seconds`) plan
    evaluations in two workers, one quiet and one beside the burner, then `fresh`
    fresh processes computing it once each."""
    rows = []
    processes: dict[str, Any] = {"processes": 0, "differing": []}
    for label, condition in CONDITIONS.items():
        env = node_env(condition)
        reference = tmp / f"peer-{len(rows)}.json"
        run_worker("peer", env, plan, reference)
        if fresh:
            found_fresh = fresh_processes(plan, max(1, fresh // len(CONDITIONS)), env,
                                          reference, tmp)
            processes["processes"] += found_fresh["processes"]
            processes["differing"] += found_fresh["differing"]
            print(f"  {label:18} fresh : {found_fresh['processes']:5d} processes, "
                  f"{len(found_fresh['differing'])} answers differ "
                  f"{sorted(set(found_fresh['differing']))}", flush=True)
        for noisy in (False, True):
            with burner(noisy):
                found = run_worker("evaluate", env, plan, tmp / "eval.json", reference,
                                   evaluations // 2, seconds / 2)
            found.update(condition=label, burner=noisy)
            rows.append(found)
            print(f"  {label:18} {'burner' if noisy else 'quiet':6}: {found['evaluations']:5d} "
                  f"plans, {found['keys']:6d} answers, {len(found['differing'])} differ "
                  f"({found['seconds']:.0f} s, torch threads {found['threads']})", flush=True)
    return {"rows": rows, "plans": sum(r["evaluations"] for r in rows),
            "answers": sum(r["keys"] for r in rows),
            "differ": sum(len(r["differing"]) for r in rows), "fresh": processes}


# ---- whole checks through a live server -------------------------------------------------


def agent(*args: str, env: dict[str, str], timeout: float = 600
          ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "numparity_agent", *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


def whole_checks(plan: list[str], checks: int, tmp: Path, deadline: float) -> dict[str, Any]:
    """`checks` whole checks, a third per condition, none started past `deadline`
    (time.monotonic()); each condition's peers and honest runs whatever the time."""
    from ingest import _server_command, running_server

    per_condition = max(1, checks // len(CONDITIONS))
    codes: dict[str, dict[int, int]] = {}
    alarms: list[dict[str, Any]] = []
    seconds: list[float] = []
    with running_server(f"sqlite:///{tmp / 'server.db'}", 1, tmp / "server.log") as server:
        base = ["--server", server.base_url, "--token", server.token]
        work = ["--workloads", *plan, "--variants", "strict", "--repeats", "1"]
        for index, (label, condition) in enumerate(CONDITIONS.items()):
            env = node_env(condition)
            for peer in range(3):
                done = agent("run", *base, *work, "--node", f"peer-{index}-{peer}",
                             "--spool", str(tmp / f"spool-{index}-{peer}"), env=env)
                assert done.returncode == 0, done.stderr[-2000:]
            found: dict[int, int] = {}
            for attempt in range(per_condition):
                # The conditions left share what time is left.
                if time.monotonic() > deadline - (len(CONDITIONS) - index - 1) * 120:
                    print(f"    {label}: stopped after {attempt} checks: the budget", flush=True)
                    break
                with burner(attempt % 2 == 1):
                    started = time.monotonic()
                    done = agent("check", *base, "--variants", "strict", "--json",
                                 "--max-seconds", "60", env=env, timeout=120)
                    seconds.append(time.monotonic() - started)
                found[done.returncode] = found.get(done.returncode, 0) + 1
                if done.returncode not in (0,):
                    print(f"    check exit {done.returncode}: {not_go(done.stdout)}"
                          f"{done.stderr[-600:]}", flush=True)
                    alarms.append({"condition": label, "attempt": attempt,
                                   "exit": done.returncode, "answers": not_go(done.stdout)})
            # A further honest node, two runs beside the burner: never a suspect.
            for run in range(2):
                with burner(True):
                    done = agent("run", *base, *work, "--node", f"honest-{index}",
                                 "--spool", str(tmp / f"spool-honest-{index}-{run}"), env=env)
                assert done.returncode == 0, done.stderr[-2000:]
            codes[label] = found
            print(f"  {label:18}: {per_condition} checks, exit codes {found}", flush=True)
        import httpx

        reader = subprocess.run(
            [*_server_command(), "token", "create", "--role", "reader", "--label",
             "bench-reader"],
            env={**os.environ, "NUMPARITY_DATABASE_URL": f"sqlite:///{tmp / 'server.db'}"},
            capture_output=True, text=True, check=True).stdout.strip()
        audit = httpx.get(f"{server.base_url}/api/v1/audit", timeout=120,
                          headers={"Authorization": f"Bearer {reader}"}).json()
    suspects = [r for r in audit.get("suspects", []) if r.get("status") == "suspect"]
    watch = [r for r in audit.get("suspects", []) if r.get("status") != "suspect"]
    total = sum(sum(c.values()) for c in codes.values())
    return {"checks": total, "exit_codes": codes, "alarms": alarms,
            "no_go": sum(c.get(10, 0) + c.get(13, 0) for c in codes.values()),
            "go": sum(c.get(0, 0) for c in codes.values()),
            "suspects": len(suspects), "watch": len(watch),
            "honest_runs": 5 * len(CONDITIONS),
            "check_seconds_max": round(max(seconds), 1) if seconds else None,
            "check_seconds_median": round(sorted(seconds)[len(seconds) // 2], 1)
            if seconds else None}


def not_go(stdout: str) -> list[dict[str, Any]] | str:
    """What a check that was not a go said of each answer that did not match (its
    `--json` report), so a false alarm can be looked into: the key, the status, the
    first differing tensor and the detail; its output's end when it is no report."""
    try:
        report = json.loads(stdout)
    except ValueError:
        return stdout[-600:]
    return [{"device": device.get("device"), **{k: answer.get(k) for k in (
        "workload", "variant", "status", "first_differing", "detail")}}
        for device in report.get("devices", []) for answer in device.get("answers", [])
        if answer.get("status") != "match"]


def rule_of_three(trials: int) -> float | None:
    return round(3 / trials, 6) if trials else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="60 plan evaluations and 6 whole checks")
    parser.add_argument("--evaluations", type=int, default=10000,
                        help="plan evaluations per condition (halved quiet and noisy)")
    parser.add_argument("--seconds", type=float, default=600,
                        help="at most this long per condition's evaluations")
    parser.add_argument("--checks", type=int, default=102)
    parser.add_argument("--fresh", type=int, default=300,
                        help="fresh processes computing the plan once each (a third per "
                        "condition)")
    parser.add_argument("--budget", type=float, default=1950,
                        help="no whole check starts past this many seconds")
    parser.add_argument("--plan", nargs="+", default=None,
                        help="the plan's workloads (default: the one bench/coverage.py wrote "
                        "into agent/proof_of_catch.json)")
    parser.add_argument("--figures", type=Path)
    parser.add_argument("--worker", choices=["peer", "evaluate", "fresh"],
                        help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--reference", help=argparse.SUPPRESS)
    parser.add_argument("--count", dest="worker_count", type=int, default=0,
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        args.evaluations = args.worker_count
        return worker(args)
    args.plan = args.plan or measured_plan()
    evaluations, checks, fresh = (20, 6, 6) if args.quick else (
        args.evaluations, args.checks, args.fresh)
    started = time.monotonic()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="numparity-false-alarms-") as folder:
        tmp = Path(folder)
        print(f"plan: {', '.join(args.plan)}; conditions: {', '.join(CONDITIONS)}")
        # Both at once: each is the other's noise, and the two cores are both used.
        print("in-process evaluations (a peer's answer, then the plan again and again) and "
              "whole checks through a live server, at once:")
        with ThreadPoolExecutor(max_workers=2) as pool:
            outer_future = pool.submit(whole_checks, args.plan, checks, tmp,
                                       started + args.budget)
            inner = in_process(args.plan, evaluations, args.seconds, tmp, fresh)
            outer = outer_future.result()
    wall = time.monotonic() - started
    trials_keys = inner["answers"]
    figures = {
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "bench": "bench/false_alarms.py" + (" --quick" if args.quick else ""),
        "plan": args.plan, "conditions": list(CONDITIONS) + ["half beside a CPU burner"],
        "plan_evaluations": inner["plans"], "answer_evaluations": trials_keys,
        "answers_differing": inner["differ"],
        "fresh_processes": inner["fresh"]["processes"],
        "fresh_answers_differing": len(inner["fresh"]["differing"]),
        "checks": outer["checks"], "check_no_go": outer["no_go"],
        "check_exit_codes": outer["exit_codes"], "check_alarms": outer["alarms"],
        "suspects": outer["suspects"],
        "watch": outer["watch"], "honest_runs": outer["honest_runs"],
        "check_seconds_max": outer["check_seconds_max"],
        "false_no_go_bound": rule_of_three(trials_keys + outer["checks"])
        if inner["differ"] == 0 and outer["no_go"] == 0 and not inner["fresh"]["differing"]
        else None,
        "wall_s": round(wall), "load": [round(x, 1) for x in load_before],
        "load_after": [round(x, 1) for x in os.getloadavg()],
    }
    n = trials_keys + outer["checks"]
    false = inner["differ"] + outer["no_go"]
    if inner["fresh"]["processes"]:
        print(f"fresh processes: {inner['fresh']['processes']}, each the plan once: "
              f"{len(inner['fresh']['differing'])} answers differ")
    print(f"\n{n} honest evaluations ({inner['plans']} of the whole plan in-process, "
          f"{trials_keys} answers, {outer['checks']} whole checks): {false} false no-go, "
          f"{outer['suspects']} suspects ({outer['watch']} watch) in the audit of "
          f"{outer['honest_runs']} honest runs")
    if false == 0:
        print(f"false no-go rate < {3 / n:.2g} per answer at 95 % (rule of three, 3/{n})")
    print(f"wall {wall:.0f} s; load before {load_before[0]:.1f}, after "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    if args.figures:
        current = json.loads(args.figures.read_text()) if args.figures.exists() else {}
        current["false_alarms"] = figures
        args.figures.write_text(json.dumps(current, indent=1, sort_keys=True) + "\n")
        print(f"figures written to {args.figures}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
