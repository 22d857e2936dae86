"""`numparity-server demo`: a simulated fleet of real CPU environment differences.

Starts the server on a temporary SQLite database on a free loopback port, runs the real
agent for every simulated node (each in a process group of its own, with the environment
variables that make its numerics differ, design §5; two nodes at a time; one node also
runs the fp64 reference, one runs a fault drill twice; every agent records op traces, and
a stock node then runs ``explain`` against each node whose settings differ), prints the
report
(``demo_report``: every cell of the fleet page that is not identical, by cause, then the
audit), then keeps serving and says how to sign in and add a node of your own, until
Ctrl-C or SIGTERM (``--no-serve`` exits after the report). A stop at any point ends the
agents and the server and removes the temporary folder.

The agent runs as a child process (``python -m numparity_agent``): the server never
imports torch.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

from numparity_server.auth.service import create_token
from numparity_server.demo_report import (
    DrillFlip,
    build_report,
    format_audit,
    format_findings,
)
from numparity_server.kit import migrate
from numparity_server.kit.db import create_engine_for, session_factory
from numparity_server.kit.net import free_port
from numparity_server.kit.policy_file import load_policy
from numparity_server.kit.settings import Settings

# Variables that change numerics on a CPU (design §2.5): cleared for every simulated node
# so the fleet is the same whatever the shell that starts the demo has set.
NUMERIC_ENV_PREFIXES = ("OMP_", "MKL_", "KMP_", "ATEN_CPU_CAPABILITY", "PYTORCH_", "NUMPARITY_")
# What explain reruns for each split: the workloads of the fleet page's findings.
WORKLOADS = ("cnn", "probes")
# What each node runs: those, the LLM-era checks the audit's numerics lines read, and
# the data pipeline (its lines: under default, real DataLoader workers).
RUN_WORKLOADS = (*WORKLOADS, "decoder", "invariance", "data")
VARIANTS = ("default", "strict")
REFERENCE_VARIANT = "fp64-reference"
SUITE = "standard"
# Agents at a time: on two cores, two at a time build the fleet in 34-40 s against 48-52 s
# one after the other (measured with other work on the machine): much of an agent's time
# is one core importing torch in a variant's child.
PARALLEL = 2
AGENT_TIMEOUT_S = 900
T = TypeVar("T")


@dataclass(frozen=True)
class SimulatedNode:
    name: str
    env: dict[str, str] = field(default_factory=dict)
    why: str = "stock configuration"
    args: tuple[str, ...] = ()  # more agent arguments
    runs: int = 1
    variants: tuple[str, ...] = VARIANTS


FLEET: tuple[SimulatedNode, ...] = (
    # One node's float64 answer is what the fp64 judge compares every group with.
    SimulatedNode("lab-01", why="stock, also the fp64 reference",
                  variants=(*VARIANTS, REFERENCE_VARIANT)),
    SimulatedNode("lab-02"),
    SimulatedNode("lab-03"),
    SimulatedNode("lab-mkl", {"MKL_CBWR": "COMPATIBLE"}, "MKL conditional bitwise mode"),
    SimulatedNode("lab-1thread", {"OMP_NUM_THREADS": "1"}, "one OpenMP thread"),
    SimulatedNode("lab-avx2", {"ATEN_CPU_CAPABILITY": "avx2"}, "ATen AVX2 kernels"),
    # A stock node whose "GPU" flips a bit in strict, twice: the audit must call it suspect.
    SimulatedNode("lab-drill", why="fault drill, run twice", args=("--fault-drill",), runs=2),
)


def node_environment(node: SimulatedNode) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(NUMERIC_ENV_PREFIXES)}
    env.update(node.env)
    return env


def agent_command(node: SimulatedNode, *, server_url: str, spool: Path,
                  workloads: Sequence[str] = RUN_WORKLOADS, variants: Sequence[str] = VARIANTS,
                  output: Path | None = None) -> list[str]:
    return [
        sys.executable, "-m", "numparity_agent", "run",
        "--server", server_url, "--node", node.name, "--spool", str(spool),
        "--workloads", *workloads, "--variants", *variants, "--trace-ops", *node.args,
        *(("--output", str(output)) if output else ()),
    ]  # fmt: skip


# The stock node that explains each split caused by a setting (design §2.11).
EXPLAINER = "lab-02"


def explain_command(node: SimulatedNode, *, server_url: str, against: str,
                    output: Path) -> list[str]:
    """`explain` on ``node`` against the run ``against``, the demo's workloads only."""
    return [
        sys.executable, "-m", "numparity_agent", "explain", "--server", server_url,
        "--node", node.name, "--against", against, "--workloads", *WORKLOADS,
        "--variants", *VARIANTS, "--output", str(output),
    ]  # fmt: skip


# ---- the fleet's agents -------------------------------------------------------------------


@dataclass(frozen=True)
class AgentRun:
    node: SimulatedNode
    returncode: int
    stderr: str
    seconds: float
    document: dict[str, Any] | None  # what the agent wrote with --output


@dataclass(frozen=True)
class ExplainRun:
    explainer: SimulatedNode
    split: SimulatedNode
    returncode: int
    stderr: str
    seconds: float
    document: dict[str, Any] | None  # what explain wrote with --output


class Agents:
    """The simulated nodes' agents. Each runs in a process group of its own (its variant
    children with it) so that a stop ends all of them, not only the ones a terminal's
    Ctrl-C reaches."""

    def __init__(self, *, server_url: str, token: str, workdir: Path) -> None:
        self.server_url, self.token, self.workdir = server_url, token, workdir
        self._lock = threading.Lock()
        self._running: set[subprocess.Popen[str]] = set()
        self._stopping = False

    def run_node(self, node: SimulatedNode) -> list[AgentRun]:
        """The node's runs, one after the other (a drill's second run is newer)."""
        done = []
        for index in range(node.runs):
            output = self.workdir / "runs" / f"{node.name}-{index + 1}.json"
            command = agent_command(node, server_url=self.server_url, variants=node.variants,
                                    spool=self.workdir / f"spool-{node.name}", output=output)
            done.append(AgentRun(node, *self._run_as(node, command, output)))
            if done[-1].returncode != 0:
                break
        return done

    def explain(self, explainer: SimulatedNode, split: AgentRun) -> ExplainRun:
        """``explainer`` finds the setting under which it gives ``split``'s bits."""
        assert split.document is not None
        output = self.workdir / "explain" / f"{explainer.name}-vs-{split.node.name}.json"
        command = explain_command(explainer, server_url=self.server_url,
                                  against=split.document["run_id"], output=output)
        return ExplainRun(explainer, split.node, *self._run_as(explainer, command, output))

    def _run_as(self, node: SimulatedNode, command: list[str], output: Path
                ) -> tuple[int, str, float, dict[str, Any] | None]:
        """(exit code, stderr, seconds, the document it wrote to ``output``) of the agent
        ``command`` in ``node``'s environment."""
        output.parent.mkdir(parents=True, exist_ok=True)
        env = node_environment(node)
        env["NUMPARITY_TOKEN"] = self.token  # not on a command line others can read
        started = time.monotonic()
        code, stderr = self._run(command, env)
        document = json.loads(output.read_text()) if output.exists() else None
        return code, stderr, time.monotonic() - started, document

    def _run(self, command: list[str], env: dict[str, str]) -> tuple[int, str]:
        with self._lock:
            if self._stopping:
                return -signal.SIGTERM, "the demo was stopped"
            process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True,
                                       start_new_session=True)
            self._running.add(process)
        try:
            try:
                _, stderr = process.communicate(timeout=AGENT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                _end_group(process)
                _, stderr = process.communicate()
                stderr += f"\nthe agent took over {AGENT_TIMEOUT_S} s and was stopped"
        finally:
            with self._lock:
                self._running.discard(process)
        return process.returncode, stderr

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            running = list(self._running)
        for process in running:
            _end_group(process)


def _end_group(process: subprocess.Popen[str]) -> None:
    """SIGTERM to the agent's process group, SIGKILL to what is left after 5 s."""
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        try:
            process.wait(timeout=wait)
            # The group outlives its leader while a variant child lives: end those too.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            return
        except subprocess.TimeoutExpired:
            continue


def _in_parallel(agents: Agents, jobs: Sequence[Callable[[], T]], name: str,
                 report: Callable[[T], None]) -> list[T]:
    """Each job's answer, ``PARALLEL`` jobs at a time, ``report``-ed in the jobs' order;
    every agent is stopped afterwards, so an interruption leaves nothing running."""
    done: list[T] = []
    pool = ThreadPoolExecutor(max_workers=max(1, min(PARALLEL, os.cpu_count() or 1)),
                              thread_name_prefix=name)
    try:
        futures: list[Future[T]] = [pool.submit(job) for job in jobs]
        for future in futures:
            answer = future.result()
            report(answer)
            done.append(answer)
    finally:
        agents.stop()
        pool.shutdown(wait=True, cancel_futures=True)
    return done


def _report_failure(returncode: int, stderr: str) -> None:
    if returncode != 0:
        print(stderr.strip(), file=sys.stderr)


def run_fleet(agents: Agents, fleet: Sequence[SimulatedNode]) -> list[AgentRun]:
    """Every node's runs, ``PARALLEL`` nodes at a time; a line per run, in fleet order."""
    def report(runs: list[AgentRun]) -> None:
        for run in runs:
            state = "uploaded" if run.returncode == 0 else f"agent exit {run.returncode}"
            print(f"  {run.node.name:<12} {run.node.why:<32} {state} in "
                  f"{run.seconds:.1f} s", flush=True)
            _report_failure(run.returncode, run.stderr)

    jobs = [functools.partial(agents.run_node, node) for node in fleet]
    return [run for runs in _in_parallel(agents, jobs, "demo-agent", report) for run in runs]


def explain_splits(agents: Agents, runs: Sequence[AgentRun],
                   fleet: Sequence[SimulatedNode]) -> list[ExplainRun]:
    """A stock node explains every node whose settings differ (``env``): the setting under
    which it gives that node's bits, two at a time; a line per explain, in fleet order."""
    explainer = next(node for node in fleet if node.name == EXPLAINER)
    newest = {run.node.name: run for run in runs if run.returncode == 0 and run.document}
    splits = [newest[node.name] for node in fleet if node.env and node.name in newest]

    def report(run: ExplainRun) -> None:
        state = (_explained(run.document or {}) if run.returncode == 0
                 else f"explain exit {run.returncode}")
        print(f"  {run.explainer.name} explains {run.split.name:<12} {state} in "
              f"{run.seconds:.1f} s", flush=True)
        _report_failure(run.returncode, run.stderr)

    jobs = [functools.partial(agents.explain, explainer, split) for split in splits]
    return _in_parallel(agents, jobs, "demo-explain", report)


def _explained(document: dict[str, Any]) -> str:
    """What one explain found, in a few words."""
    findings = document.get("findings", [])
    found = sorted({f["label"] for f in findings
                    if f.get("status") == "reproduced" and f.get("label")})
    if found:
        return f"found {', '.join(found)}"
    if findings and all(f.get("status") == "already" for f in findings):
        return "no split here: the same bits already"
    return "no single setting or pair reproduces it"


def drill_flips(runs: Sequence[AgentRun]) -> dict[tuple[str, str, str], DrillFlip]:
    """The bit each drill flipped, from the agents' documents (the server does not keep
    a result's ``drill`` field, design §2.7)."""
    flips = {}
    for run in runs:
        document = run.document or {}
        for result in document.get("results", []):
            flip = result.get("drill")
            if isinstance(flip, dict):
                flips[(document["run_id"], result["workload"], result["variant"])] = DrillFlip(
                    layer=flip["layer"], index=flip["index"], bit=flip["bit"],
                    before=flip["before"], after=flip["after"])
    return flips


def node_costs(runs: Sequence[AgentRun]) -> dict[str, tuple[str | None, float | None]]:
    """Per node, of its newest run: (env_key, strict over default wall time summed over the
    workloads with both) — the spread the audit's per-environment figure is shown with."""
    costs: dict[str, tuple[str | None, float | None]] = {}
    for run in runs:
        if not run.document:
            continue
        walls: dict[str, dict[str, float]] = {}
        for result in run.document.get("results", []):
            if result.get("status") == "ok" and result.get("wall_s") is not None:
                walls.setdefault(result["workload"], {})[result["variant"]] = result["wall_s"]
        both = [w for w in walls.values() if {"default", "strict"} <= w.keys()]
        default_s = sum(w["default"] for w in both)
        ratio = sum(w["strict"] for w in both) / default_s if default_s > 0 else None
        costs[run.node.name] = (run.document.get("environment", {}).get("env_key"), ratio)
    return costs


# ---- the server -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Tokens:
    fleet: str  # the simulated nodes' agent token
    yours: str  # an agent token for a node of your own
    reader: str


def prepare_database(settings: Settings) -> Tokens:
    """Migrate the demo's database and make its tokens."""
    migrate.upgrade(settings.database_url)
    engine = create_engine_for(settings, pooled=False)
    try:
        with session_factory(engine)() as session:
            fleet = create_token(session=session, role="agent", label="demo fleet")
            yours = create_token(session=session, role="agent", label="demo: your node")
            reader = create_token(session=session, role="reader", label="demo reader")
    finally:
        engine.dispose()
    return Tokens(fleet=fleet.token, yours=yours.token, reader=reader.token)


@contextlib.contextmanager
def embedded_server(settings: Settings, port: int) -> Iterator[str]:
    """A real uvicorn serving the app in a thread of this process."""
    import uvicorn

    from numparity_server.app import create_app

    app = create_app(settings)
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="numparity-server", daemon=True)
    thread.start()
    base_url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the server did not start on {base_url}")
        time.sleep(0.05)
    try:
        yield base_url
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def print_report(settings: Settings, runs: Sequence[AgentRun], *, dashboard: str) -> None:
    engine = create_engine_for(settings, pooled=False)
    try:
        with session_factory(engine)() as session:
            report = build_report(session=session, policy=load_policy(settings.policy_file),
                                  suite=SUITE, drills=drill_flips(runs),
                                  node_costs=node_costs(runs), max_nodes=settings.page_max)
    finally:
        engine.dispose()
    print()
    print(format_findings(report, dashboard=dashboard))
    print()
    print(format_audit(report))


def your_node_lines(*, base_url: str, tokens: Tokens, workdir: Path, kept: bool) -> list[str]:
    """What to do next, with everything filled in: sign in, the API, a node of your own."""
    script = Path(sys.executable).with_name("numparity-agent")
    if script.exists():
        relative = os.path.relpath(script)
        agent = [relative if not relative.startswith("..") else str(script)]
    else:
        agent = [sys.executable, "-m", "numparity_agent"]
    command = [*agent, "run", "--server", base_url, "--spool", str(workdir / "spool-yours"),
               "--workloads", *WORKLOADS, "--variants", *VARIANTS]
    stop = (f"Ctrl-C stops the demo ({workdir} is kept)." if kept else
            f"Ctrl-C stops the demo and removes {workdir}.")
    return [
        f"Dashboard: {base_url}/ — sign in with the reader token {tokens.reader}",
        f"API: {base_url}/docs (the same token as an Authorization: Bearer header)",
        "Add a node of your own: in another shell, in this folder, run",
        f"  NUMPARITY_TOKEN={tokens.yours} {shlex.join(command)}",
        f"It appears on the fleet page as {socket.gethostname()} (the agent's default "
        f"node name; --node NAME for another).",
        stop,
    ]


# ---- main -------------------------------------------------------------------------------


class Stopped(BaseException):
    """SIGTERM, raised in the main thread as Ctrl-C raises KeyboardInterrupt (a
    BaseException too, so no ``except Exception`` swallows it)."""


def _raise_stopped(signum: int, frame: FrameType | None) -> None:
    raise Stopped


def parser() -> argparse.ArgumentParser:
    """``numparity-server demo``'s options (the server's CLI hands them over whole)."""
    demo = argparse.ArgumentParser(prog="numparity-server demo", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    demo.add_argument("--no-serve", action="store_true", help="exit after the report")
    demo.add_argument("--port", type=int, default=0, help="port (default: a free one)")
    demo.add_argument("--workdir", type=Path, help="keep the database and spools here")
    return demo


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)

    # Ctrl-C stops the demo even when it was started with SIGINT ignored (a job put in
    # the background by a non-interactive shell inherits that, and Python then never
    # raises KeyboardInterrupt).
    previous = (signal.signal(signal.SIGTERM, _raise_stopped),
                signal.signal(signal.SIGINT, signal.default_int_handler))
    try:
        return _demo(args)
    except (KeyboardInterrupt, Stopped) as stop:
        # Raised before serving: the with-blocks have ended the agents and the server and
        # removed the temporary folder on the way out.
        code = 128 + (signal.SIGTERM if isinstance(stop, Stopped) else signal.SIGINT)
        print("\nnumparity demo: stopped before the report; nothing is left behind.",
              file=sys.stderr)
        return int(code)
    finally:
        signal.signal(signal.SIGTERM, previous[0])
        signal.signal(signal.SIGINT, previous[1])


def _demo(args: argparse.Namespace) -> int:
    with contextlib.ExitStack() as stack:
        kept = args.workdir is not None
        workdir = args.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(
            prefix="numparity-demo-", ignore_cleanup_errors=True)))
        workdir.mkdir(parents=True, exist_ok=True)
        database_url = f"sqlite:///{workdir / 'numparity.db'}"
        # The demo's own database; the other settings as the shell sets them.
        settings = Settings(database_url=database_url)
        tokens = prepare_database(settings)

        base_url = stack.enter_context(embedded_server(settings, args.port or free_port()))
        print(f"numparity demo: server on {base_url}, database {database_url}", flush=True)

        agents = Agents(server_url=base_url, token=tokens.fleet, workdir=workdir)
        runs = run_fleet(agents, FLEET)
        explains = explain_splits(Agents(server_url=base_url, token=tokens.fleet,
                                         workdir=workdir), runs, FLEET)
        failed = sum(1 for code in [*(r.returncode for r in runs),
                                    *(e.returncode for e in explains)] if code != 0)
        print_report(settings, runs, dashboard="" if args.no_serve else f"{base_url}/")

        if failed:
            print(f"\n{failed} simulated node(s) failed; see above.", file=sys.stderr)
            return 1
        if args.no_serve:
            return 0
        print()
        for line in your_node_lines(base_url=base_url, tokens=tokens, workdir=workdir,
                                    kept=kept):
            print(line)
        sys.stdout.flush()
        try:
            while True:
                time.sleep(3600)
        except (KeyboardInterrupt, Stopped):
            # A stop while serving is the normal end: leave the with-blocks (the server
            # stops, the temporary folder goes) and exit 0.
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
    print("numparity demo: stopped" + ("." if kept else f"; removed {workdir}."), flush=True)
    return 0
