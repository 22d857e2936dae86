"""What `numparity-agent check` costs the server: a cluster starting its jobs at once.

Not run by CI. Starts ``numparity-server serve`` on a free loopback port (SQLite, a
temporary file; PostgreSQL, a temporary database on ``--postgres-url`` with
``--pg-workers`` processes), loads a fleet through the real ingest (``--environments``
environments of ``--nodes`` nodes each, full-suite documents fingerprinted by the agent's
own code), pins the first environment (its own scope: the environments share one stack
and none holds a majority of it) with an admin token, then fires
``--checks`` (1,000) concurrent `GET /api/v1/agent/check` — the one request a `check`
makes — as the agent words it, each on its own connection:

- one environment: every node of a cluster of identical nodes asks the same question;
- every environment: the same number spread over them (one question per environment);
- cold: each question's first answer (nothing kept), one at a time: what one
  computation costs;
- uncached: the one-environment burst again on a server that keeps nothing
  (``NUMPARITY_CHECK_CACHE_SECONDS=0``, ``NUMPARITY_READ_CACHE_MAX_AGE_S=0``): what the
  per-question cache saves.

Prints per scenario: checks/s, p50/p99/max latency, the answer's size (body bytes, and
gzip for reference), and the server's CPU per check and in all.

    .venv/bin/python bench/check.py [--checks 1000] [--environments 10] [--nodes 20]
        [--backends sqlite postgresql] [--postgres-url postgresql+psycopg://...]
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ingest import (  # noqa: E402 - the benchmarks' shared server and fleet helpers
    _server_command,
    as_new_environment,
    as_run,
    running_server,
    server_cpu_seconds,
    suite_document,
    temporary_database,
)

CHECK_PATH = "/api/v1/agent/check"


def check_url(base_url: str, environment: dict[str, Any]) -> str:
    """The question the agent asks (`_check.fetch_plan`): its env_key, its device model,
    its stack, a 60 s budget less what listing the node took, a child's start."""
    torch = environment.get("torch") or {}
    cpu = environment.get("cpu") or {}
    stack = {"torch": torch.get("version"), "cpu_model": cpu.get("model"),
             "cpu_capability": cpu.get("capability")}
    query = [("suite", "standard"), ("env_key", environment["env_key"]), ("model", "cpu"),
             ("budget_s", "55"), ("child_s", "4.0"),
             *sorted((k, v) for k, v in stack.items() if v is not None)]
    return f"{base_url}{CHECK_PATH}?{urlencode(query)}"


@dataclass
class Figures:
    checks: int
    failed: int
    seconds: float
    latencies: list[float]
    body_bytes: int
    gzip_bytes: int
    server_cpu_s: float
    client_cpu_s: float = 0.0

    def line(self, label: str) -> str:
        lat = sorted(self.latencies) or [0.0]
        p99 = lat[min(len(lat) - 1, int(round(0.99 * (len(lat) - 1))))]
        return (f"{label:<44} {self.checks:5d} checks (failed {self.failed}) in "
                f"{self.seconds:5.2f} s = {self.checks / self.seconds:7.0f}/s  p50 "
                f"{statistics.median(lat) * 1000:6.0f} ms  p99 {p99 * 1000:6.0f} ms  max "
                f"{lat[-1] * 1000:6.0f} ms  answer {self.body_bytes / 1024:5.1f} KiB "
                f"({self.gzip_bytes / 1024:4.1f} gzip)  server CPU {self.server_cpu_s:5.2f} s "
                f"({self.server_cpu_s / max(self.checks, 1) * 1000:5.2f} ms/check), client "
                f"{self.client_cpu_s:5.2f} s")


@dataclass
class Answer:
    status: int
    body: bytes


async def _get(host: str, port: int, target: str, token: str) -> Answer:
    """One GET on its own connection, as plain HTTP/1.1 (httpx's asyncio client costs more
    CPU per request than the server does: it would measure itself)."""
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(f"GET {target} HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer "
                 f"{token}\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    raw = await reader.read()
    writer.close()
    head, _sep, body = raw.partition(b"\r\n\r\n")
    return Answer(int(head.split(b" ", 2)[1]), body)


async def _burst(urls: list[str], token: str) -> tuple[list[float], list[Answer]]:
    start = asyncio.Event()

    async def one(url: str) -> tuple[float, Answer]:
        parsed = urlsplit(url)
        await start.wait()
        began = time.perf_counter()
        answer = await _get(parsed.hostname or "127.0.0.1", parsed.port or 80,
                            f"{parsed.path}?{parsed.query}", token)
        return time.perf_counter() - began, answer

    tasks = [asyncio.create_task(one(url)) for url in urls]
    await asyncio.sleep(0)
    start.set()
    done = await asyncio.gather(*tasks)
    return [d[0] for d in done], [d[1] for d in done]


def burst(server: Any, urls: list[str]) -> Figures:
    cpu_before = server_cpu_seconds(server.process.pid)
    client_before = time.process_time()
    began = time.monotonic()
    latencies, answers = asyncio.run(_burst(urls, server.token))
    seconds = time.monotonic() - began
    cpu = server_cpu_seconds(server.process.pid) - cpu_before
    client = time.process_time() - client_before
    ok = [a for a in answers if a.status == 200]
    failed = len(answers) - len(ok)
    if failed:
        print(f"  {failed} answered {sorted({a.status for a in answers})}", file=sys.stderr)
    sample = ok[0].body if ok else b""
    return Figures(len(answers), failed, seconds, latencies, len(sample),
                   len(gzip.compress(sample)), cpu, client)


def admin_token(database_url: str) -> str:
    env = {**os.environ, "NUMPARITY_DATABASE_URL": database_url}
    return subprocess.run([*_server_command(), "token", "create", "--role", "admin", "--label",
                           "bench-admin"], env=env, check=True, capture_output=True,
                          text=True).stdout.strip()


def scenario(label: str, database_url: str, workers: int, args: argparse.Namespace,
             template: dict[str, Any], workdir: Path) -> list[str]:
    lines = []
    with running_server(database_url, workers, workdir / f"{label}.log") as server:
        began = time.monotonic()
        environments = []
        with httpx.Client(timeout=300, headers={"Authorization": f"Bearer {server.token}"}
                          ) as client:
            minute = 0
            for env_index in range(args.environments):
                for node in range(args.nodes):
                    name = f"e{env_index}-n{node}"
                    minute += 1
                    document = (as_run(template, name, minute) if env_index == 0
                                else as_new_environment(template, name, minute)
                                if node == 0 else as_run(environments[-1], name, minute))
                    if node == 0:
                        environments.append(document)
                    response = client.post(f"{server.base_url}/api/v1/runs", json=document)
                    if response.status_code not in (200, 201):
                        raise RuntimeError(f"fleet: run of {name} answered "
                                           f"{response.status_code} {response.text[:2000]}")
        print(f"{label}: {args.environments * args.nodes} nodes on {args.environments} "
              f"environments loaded in {time.monotonic() - began:.0f} s", flush=True)
        admin = admin_token(database_url)
        pinned = httpx.post(f"{server.base_url}/api/v1/goldens", timeout=120,
                            headers={"Authorization": f"Bearer {admin}"},
                            json={"source": "majority", "scope": "environment",
                                  "env_key": environments[0]["environment"]["env_key"],
                                  "reason": "bench"})
        if pinned.status_code != 201:
            raise RuntimeError(f"pin: {pinned.status_code} {pinned.text}")

        urls = [check_url(server.base_url, doc["environment"]) for doc in environments]
        cold = [burst(server, [url]) for url in urls]
        first = Figures(len(cold), sum(f.failed for f in cold),
                        sum(f.seconds for f in cold),
                        [lat for f in cold for lat in f.latencies], cold[0].body_bytes,
                        cold[0].gzip_bytes, sum(f.server_cpu_s for f in cold),
                        sum(f.client_cpu_s for f in cold))
        lines.append(first.line(f"{label}: cold, one question at a time"))
        print(lines[-1], flush=True)
        same = burst(server, [urls[0]] * args.checks)
        lines.append(same.line(f"{label}: {args.checks} concurrent, one environment"))
        print(lines[-1], flush=True)
        spread = burst(server, [urls[i % len(urls)] for i in range(args.checks)])
        lines.append(spread.line(f"{label}: {args.checks} concurrent, "
                                 f"{len(urls)} environments"))
        print(lines[-1], flush=True)
    keep_nothing = {"NUMPARITY_CHECK_CACHE_SECONDS": "0", "NUMPARITY_READ_CACHE_MAX_AGE_S": "0"}
    saved = {name: os.environ.get(name) for name in keep_nothing}
    os.environ.update(keep_nothing)
    try:
        with running_server(database_url, workers, workdir / f"{label}-uncached.log") as server:
            url = check_url(server.base_url, environments[0]["environment"])
            uncached = burst(server, [url] * args.checks)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    lines.append(uncached.line(f"{label}: {args.checks} concurrent, nothing kept"))
    print(lines[-1], flush=True)
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checks", type=int, default=1000)
    parser.add_argument("--environments", type=int, default=10)
    parser.add_argument("--nodes", type=int, default=20, help="nodes per environment")
    parser.add_argument("--backends", nargs="+", default=["sqlite", "postgresql"])
    parser.add_argument("--postgres-url",
                        default=os.environ.get("NUMPARITY_TEST_DATABASE_URL",
                                               "postgresql+psycopg://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--pg-workers", type=int, default=2)
    args = parser.parse_args()
    template = suite_document("seed")
    print(f"document: {len(template['results'])} results; {os.cpu_count()} CPUs; "
          f"{args.checks} checks", flush=True)
    lines: list[str] = []
    workdir = Path(tempfile.mkdtemp(prefix="numparity-bench-check-"))
    try:
        if "sqlite" in args.backends:
            lines += scenario("sqlite", f"sqlite:///{workdir / 'bench.db'}", 1, args,
                              template, workdir)
        if "postgresql" in args.backends:
            with temporary_database(args.postgres_url, "numparity_bench_check") as database:
                lines += scenario(f"postgresql ({args.pg_workers} workers)", database.url,
                                  args.pg_workers, args, template, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print("\nsummary")
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
