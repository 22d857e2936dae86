"""`numparity-server demo`: a simulated fleet of real CPU environment differences.

Starts the server on a temporary SQLite database on a free loopback port, runs the real
agent once per simulated node (each in its own process, with the environment variables
that make its numerics differ, design §5; one node runs a fault drill twice), prints the
divergence reports and the audit, then keeps serving until Ctrl-C (``--no-serve``
exits after the report).

The agent runs as a child process (``python -m numparity_agent``): the server never
imports torch.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from numparity_server.auth.service import create_token
from numparity_server.demo_report import format_audit, format_divergence
from numparity_server.kit import migrate
from numparity_server.kit.db import create_engine_for, session_factory
from numparity_server.kit.net import free_port
from numparity_server.kit.settings import Settings

# Variables that change numerics on a CPU (design §2.5): cleared for every simulated node
# so the fleet is the same whatever the shell that starts the demo has set.
NUMERIC_ENV_PREFIXES = ("OMP_", "MKL_", "KMP_", "ATEN_CPU_CAPABILITY", "PYTORCH_", "NUMPARITY_")


@dataclass(frozen=True)
class SimulatedNode:
    name: str
    env: dict[str, str] = field(default_factory=dict)
    why: str = "stock configuration"
    args: tuple[str, ...] = ()  # more agent arguments
    runs: int = 1


FLEET: tuple[SimulatedNode, ...] = (
    SimulatedNode("lab-01"),
    SimulatedNode("lab-02"),
    SimulatedNode("lab-03"),
    SimulatedNode("lab-mkl", {"MKL_CBWR": "COMPATIBLE"}, "MKL conditional bitwise mode"),
    SimulatedNode("lab-1thread", {"OMP_NUM_THREADS": "1"}, "one OpenMP thread"),
    SimulatedNode("lab-avx2", {"ATEN_CPU_CAPABILITY": "avx2"}, "ATen AVX2 kernels"),
    # A stock node whose "GPU" flips a bit in strict, twice: the audit must call it suspect.
    SimulatedNode("lab-drill", why="fault drill, run twice", args=("--fault-drill",), runs=2),
)
WORKLOADS = ("cnn", "probes")
VARIANTS = ("default", "strict")
# What the report shows: (workload, variant, tensor). The MKL node differs in cnn's
# fully connected layers; the one-thread node in a long sum (ATen splits a reduction by
# thread count on any CPU; whether MKL's matmuls do depends on the CPU).
VIEWS = (("cnn", "default", "output"), ("cnn", "strict", "output"),
         ("probes", "default", "sum_long"))



def node_environment(node: SimulatedNode) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(NUMERIC_ENV_PREFIXES)}
    env.update(node.env)
    return env


def run_agent(
    node: SimulatedNode,
    *,
    server_url: str,
    token: str,
    spool: Path,
    workloads: Sequence[str] = WORKLOADS,
    variants: Sequence[str] = VARIANTS,
) -> subprocess.CompletedProcess[str]:
    """Run the real agent for one simulated node; its exit code is the agent's."""
    command = [
        sys.executable, "-m", "numparity_agent", "run",
        "--server", server_url, "--node", node.name, "--spool", str(spool),
        "--workloads", *workloads, "--variants", *variants, *node.args,
    ]  # fmt: skip
    env = node_environment(node)
    # The token travels in the environment, not on a command line other users can read.
    env["NUMPARITY_TOKEN"] = token
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)



def prepare_database(settings: Settings) -> tuple[str, str]:
    """Migrate the demo's database and make its tokens: (agent token, reader token)."""
    migrate.upgrade(settings.database_url)
    engine = create_engine_for(settings, pooled=False)
    try:
        with session_factory(engine)() as session:
            agent = create_token(session=session, role="agent", label="demo fleet")
            reader = create_token(session=session, role="reader", label="demo reader")
    finally:
        engine.dispose()
    return agent.token, reader.token


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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="numparity-server demo", description=__doc__)
    parser.add_argument("--no-serve", action="store_true", help="exit after the report")
    parser.add_argument("--port", type=int, default=0, help="port (default: a free one)")
    parser.add_argument("--workdir", type=Path, help="keep the database and spools here")
    args = parser.parse_args(argv)

    with contextlib.ExitStack() as stack:
        workdir = args.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        workdir.mkdir(parents=True, exist_ok=True)
        database_url = f"sqlite:///{workdir / 'numparity.db'}"
        # The demo's own database; the other settings as the shell sets them.
        settings = Settings(database_url=database_url)
        agent_token, reader_token = prepare_database(settings)

        base_url = stack.enter_context(embedded_server(settings, args.port or free_port()))
        print(f"numparity demo: server on {base_url}, database {database_url}", flush=True)

        failed = 0
        for node in FLEET:
            for _ in range(node.runs):
                started = time.monotonic()
                done = run_agent(node, server_url=base_url, token=agent_token,
                                 spool=workdir / f"spool-{node.name}")
                took = time.monotonic() - started
                state = "uploaded" if done.returncode == 0 else f"agent exit {done.returncode}"
                print(f"  {node.name:<12} {node.why:<32} {state} in {took:.1f} s", flush=True)
                if done.returncode != 0:
                    failed += 1
                    print(done.stderr.strip(), file=sys.stderr)

        headers = {"Authorization": f"Bearer {reader_token}"}
        with httpx.Client(base_url=base_url, headers=headers, timeout=60) as client:
            for workload, variant, tensor in VIEWS:
                response = client.get("/api/v1/divergence", params={
                    "workload": workload, "variant": variant, "tensor": tensor})
                response.raise_for_status()
                print()
                print(format_divergence(response.json()))
            response = client.get("/api/v1/audit")
            response.raise_for_status()
            print()
            print(format_audit(response.json()))

        if failed:
            print(f"\n{failed} simulated node(s) failed; see above.", file=sys.stderr)
            return 1
        if args.no_serve:
            return 0
        print(f"\nDashboard: {base_url}/ (sign in with the reader token {reader_token}); "
              f"API: {base_url}/docs. Ctrl-C to stop.")
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)
    return 0
