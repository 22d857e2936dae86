"""Abuse benchmark: honest agents upload while hostile clients attack the server (design §6).

Not run by CI. Starts ``numparity-server serve`` (``bench/ingest.py``'s ``running_server``)
on SQLite (a temporary file) or PostgreSQL (a temporary database), then runs the same
honest load twice, for ``--seconds`` each:

- quiet: ``--agents`` honest agents (threads, each with a token bound to its own node),
  each uploading full-suite runs the way the agent does on a known environment
  (``numparity_agent.testing.upload_document``), back to back; one reader polls the
  fleet's reads (``/api/v1/nodes``, ``/api/v1/divergence``, ``/readyz``);
- hostile: the same, while a separate process (so the honest clients keep their own
  interpreter) attacks with one unbound agent token, every attack at once:
  stalled bodies (sockets that send headers and part of a body, then nothing, reopened
  when the server drops them), huge strings (a body of a million short strings with a
  NUL escape), poison shapes (a shape whose element count overflows int64), future
  timestamps (a run for an honest node, started in year 9999), impersonation (a token
  bound to its own node writing as an honest one), and floods of
  ``/fingerprints/missing`` with 100,000 hashes.

It prints, per phase, honest-run p50/p99 latency, reads answered vs 503 (or failed),
server RSS before/after and the runs lost (uploaded by an honest agent, answered 201, but
not listed by ``/api/v1/runs``; must be 0), and the hostile/quiet p99 ratio. Targets
(issue 13): p99 within 2x of the quiet run, 0 read 503s, 0 lost, RSS growth < 200 MiB.

    .venv/bin/python bench/abuse.py [--backend sqlite|postgresql] [--agents 20]
        [--seconds 40] [--stalled 30] [--postgres-url ...]

With ``--reads`` it runs instead the cases of issue 30 (bench/_reads_abuse.py): uploads
within every limit that made reads slow or huge (50,000-op traces, results pointing at
a 4,096-tensor manifest, 5.5-million-element values, large environment documents, one
token under 8 header spellings, made-up workload names), each read's time, size and the
server's memory growth against the targets (<= 2 s, <= 16 MiB, <= 256 MiB), /healthz
under 45 readers (<= 1 s), disk growth (<= 2x the decompressed bytes accepted) and
SIGTERM (<= 5 s). ``--scale`` shrinks the sizes (1: the issue's).

    .venv/bin/python bench/abuse.py --reads [--cases traces compare values environments
        spellings metrics] [--scale 1] [--backend sqlite|postgresql]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import _reads_abuse
import httpx
from ingest import (
    _server_command,
    as_run,
    node_memory,
    running_server,
    suite_document,
    temporary_database,
)

from numparity_agent.testing import upload_document

HOSTILE_NODE = "hostile-0"


@dataclass
class Phase:
    latencies: list[float] = field(default_factory=list)
    uploads: Counter[int] = field(default_factory=Counter)
    reads: Counter[str] = field(default_factory=Counter)
    read_latencies: list[float] = field(default_factory=list)
    accepted: dict[str, set[str]] = field(default_factory=dict)  # node -> run_ids
    rss_before: int = 0
    rss_after: int = 0

    def p(self, q: float, reads: bool = False) -> float:
        ordered = sorted(self.read_latencies if reads else self.latencies) or [0.0]
        return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def rss_bytes(pid: int) -> int:
    """Resident memory of the server process and its workers."""
    total, pids = 0, [pid]
    while pids:
        current = pids.pop()
        try:
            status = Path(f"/proc/{current}/status").read_text()
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) * 1024
        pids.extend(int(child) for child in children)
    return total


def create_token(env: dict[str, str], *args: str) -> str:
    return subprocess.run([*_server_command(), "token", "create", *args], env=env, check=True,
                          capture_output=True, text=True).stdout.split()[0]


def honest_token(env: dict[str, str], node: str) -> str:
    """A token bound to ``node``; an unbound one from a server without bindings (to measure
    a server from before them)."""
    try:
        return create_token(env, "--role", "agent", "--node", node)
    except subprocess.CalledProcessError:
        return create_token(env, "--role", "agent")


# -- honest side --------------------------------------------------------------------------

def honest_load(base_url: str, tokens: list[str], template: dict[str, Any], seconds: float,
                phase: Phase, reader_token: str, minute0: int) -> None:
    stop = time.monotonic() + seconds
    lock = threading.Lock()
    memory = node_memory_for(base_url, template)

    def agent(i: int) -> None:
        node = f"honest-{i:03d}"
        minute = minute0
        with httpx.Client(timeout=120) as client:
            while time.monotonic() < stop:
                minute += 1
                stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
                document = {**as_run(template, node, minute), "started_at": stamp,
                            "finished_at": stamp}
                began = time.perf_counter()
                outcome = upload_document(document, server=base_url, token=tokens[i],
                                          client=client, known=memory)
                elapsed = time.perf_counter() - began
                with lock:
                    phase.latencies.append(elapsed)
                    phase.uploads[outcome.status or 0] += 1
                    if outcome.status in (200, 201):
                        phase.accepted.setdefault(node, set()).add(document["run_id"])

    def reader() -> None:
        headers = {"Authorization": f"Bearer {reader_token}"}
        paths = ("/api/v1/nodes?limit=5", "/api/v1/divergence?workload=mlp&variant=default",
                 "/readyz")
        with httpx.Client(base_url=base_url, headers=headers, timeout=60) as client:
            i = 0
            while time.monotonic() < stop:
                path = paths[i % len(paths)]
                i += 1
                began = time.perf_counter()
                try:
                    status = str(client.get(path).status_code)
                except httpx.HTTPError as exc:
                    status = type(exc).__name__
                with lock:
                    phase.reads[status] += 1
                    phase.read_latencies.append(time.perf_counter() - began)
                time.sleep(0.2)

    threads = [threading.Thread(target=agent, args=(i,)) for i in range(len(tokens))]
    threads.append(threading.Thread(target=reader))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def node_memory_for(base_url: str, template: dict[str, Any]) -> Any:
    @dataclass
    class _Server:
        base_url: str
    return node_memory(_Server(base_url), template)  # type: ignore[arg-type]


def lost_runs(base_url: str, reader_token: str, phase: Phase) -> int:
    """Runs an honest agent was told were stored but the server does not list."""
    headers = {"Authorization": f"Bearer {reader_token}"}
    lost = 0
    with httpx.Client(base_url=base_url, headers=headers, timeout=120) as client:
        for node, run_ids in phase.accepted.items():
            listed: set[str] = set()
            offset = 0
            while True:
                page = client.get("/api/v1/runs", params={"node": node, "limit": 500,
                                                          "offset": offset}).json()
                listed.update(item["run_id"] for item in page["items"])
                offset += len(page["items"])
                if not page["items"] or offset >= page["total"]:
                    break
            lost += len(run_ids - listed)
    return lost


# -- hostile side (its own process) -------------------------------------------------------

ATTACKS = ("stalled bodies", "huge strings", "poison shape", "future timestamp",
           "impersonation", "missing flood")


def hostile(base_url: str, token: str, bound_token: str, template: dict[str, Any],
            seconds: float, stalled: int, counts: Any, chosen: tuple[str, ...]) -> None:
    stop = time.monotonic() + seconds
    host, port = urlsplit(base_url).hostname, urlsplit(base_url).port

    def tally(name: str) -> None:
        counts[name] = counts.get(name, 0) + 1

    def stall() -> None:
        # Headers and a tenth of the promised body, then nothing; reopened when dropped.
        sockets: list[socket.socket] = []
        try:
            while time.monotonic() < stop:
                while len(sockets) < stalled:
                    try:
                        sock = socket.create_connection((host, port), timeout=5)
                        sock.sendall(b"POST /api/v1/runs HTTP/1.1\r\nHost: x\r\n"
                                     b"Authorization: Bearer " + token.encode() + b"\r\n"
                                     b"Content-Type: application/json\r\n"
                                     b"Content-Length: 100000\r\n\r\n" + b"{" + b" " * 9999)
                        sock.setblocking(False)
                        sockets.append(sock)
                        tally("stalled body opened")
                    except OSError:
                        tally("stalled body refused")
                        time.sleep(0.5)
                        break
                for sock in list(sockets):
                    try:
                        if sock.recv(4096) == b"":
                            raise ConnectionError
                        tally("stalled body answered")
                        sock.close()
                        sockets.remove(sock)
                    except BlockingIOError:
                        pass
                    except OSError:
                        tally("stalled body dropped")
                        sock.close()
                        sockets.remove(sock)
                time.sleep(0.5)
        finally:
            for sock in sockets:
                sock.close()

    huge_strings = (b'{"schema":"numparity.run/v1","environment":{"env_key":"' + b"0" * 64
                    + b'","junk":["\\u0000",' + b",".join([b'"abcd"'] * 1_000_000) + b"]}}")

    def poison(started_at: str, node: str, shape: list[int] | None) -> bytes:
        document = as_run(template, node, 1)
        document = {**document, "started_at": started_at, "results": [
            {**document["results"][0], "tensors": [
                {**tensor, "hash": secrets.token_hex(32), "values": None,
                 **({"shape": shape} if shape else {})}
                for tensor in document["results"][0]["tensors"]]}]}
        return json.dumps(document).encode()

    flood = json.dumps({"hashes": [secrets.token_hex(32) for _ in range(100_000)]}).encode()
    now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    attacks = {
        "huge strings": ("/api/v1/runs", lambda: huge_strings, token),
        "poison shape": ("/api/v1/runs",
                         lambda: poison("2026-11-21T10:00:00Z", HOSTILE_NODE, [2**62, 3]),
                         token),
        "future timestamp": ("/api/v1/runs",
                             lambda: poison("9999-01-01T00:00:00Z", "honest-000", None), token),
        # A token bound to its own node writing as another.
        "impersonation": ("/api/v1/runs", lambda: poison(now, "honest-001", None), bound_token),
        "missing flood": ("/api/v1/fingerprints/missing", lambda: flood, token),
    }

    def attack(name: str, path: str, body: Any, token: str) -> None:
        auth = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=base_url, headers=auth, timeout=120) as client:
            while time.monotonic() < stop:
                try:
                    status = client.post(path, content=body(), headers={
                        "Content-Type": "application/json"}).status_code
                    tally(f"{name} {status}")
                except httpx.HTTPError as exc:
                    tally(f"{name} {type(exc).__name__}")

    threads = [threading.Thread(target=stall)] if "stalled bodies" in chosen else []
    threads += [threading.Thread(target=attack, args=(name, *how))
                for name, how in attacks.items() if name in chosen]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


# -- the run ------------------------------------------------------------------------------

@contextmanager
def database(args: argparse.Namespace, workdir: Path) -> Any:
    if args.backend == "sqlite":
        yield f"sqlite:///{workdir / 'abuse.db'}"
        return
    with temporary_database(args.postgres_url, "numparity_abuse") as temporary:
        yield temporary.url


def run_phase(label: str, server: Any, tokens: list[str], reader: str,
              hostile_tokens: tuple[str, str],
              template: dict[str, Any], args: argparse.Namespace, minute0: int,
              with_hostile: bool) -> tuple[Phase, dict[str, int]]:
    phase = Phase(rss_before=rss_bytes(server.process.pid))
    manager = multiprocessing.Manager()
    counts = manager.dict()
    attacker = None
    if with_hostile:
        attacker = multiprocessing.Process(target=hostile, args=(
            server.base_url, *hostile_tokens, template, args.seconds, args.stalled, counts,
            tuple(args.attacks)))
        attacker.start()
        time.sleep(2)  # the stalled sockets are open before the honest load starts
    honest_load(server.base_url, tokens, template, args.seconds, phase, reader, minute0)
    if attacker is not None:
        attacker.join(timeout=args.seconds + 120)
        if attacker.is_alive():
            attacker.terminate()
    phase.rss_after = rss_bytes(server.process.pid)
    attacks = dict(counts)
    manager.shutdown()
    lost = lost_runs(server.base_url, reader, phase)
    reads_ok = phase.reads.get("200", 0)
    reads_bad = sum(n for status, n in phase.reads.items() if status != "200")
    print(f"{label:<8} honest runs {len(phase.latencies):5d} "
          f"(answers {dict(sorted(phase.uploads.items()))})  "
          f"p50 {statistics.median(phase.latencies or [0]) * 1000:7.1f} ms  "
          f"p99 {phase.p(0.99) * 1000:7.1f} ms  reads 200 {reads_ok} other "
          f"{reads_bad} {dict(phase.reads) if reads_bad else ''} "
          f"(p99 {phase.p(0.99, reads=True) * 1000:.0f} ms)  "
          f"RSS {phase.rss_before / 2**20:6.1f} -> {phase.rss_after / 2**20:6.1f} MiB  "
          f"lost {lost}", flush=True)
    if attacks:
        print(f"         attacks: {json.dumps(dict(sorted(attacks.items())))}", flush=True)
    return phase, {"lost": lost, "reads_bad": reads_bad}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("sqlite", "postgresql"), default="sqlite")
    parser.add_argument("--agents", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=40.0, help="length of each phase")
    parser.add_argument("--stalled", type=int, default=30, help="stalled bodies held open")
    parser.add_argument("--workers", type=int, default=1, help="server processes")
    parser.add_argument("--no-budget", action="store_true",
                        help="turn the per-token byte budget off (to see what it buys)")
    parser.add_argument("--attacks", nargs="+", choices=ATTACKS, default=list(ATTACKS),
                        help="which attacks the hostile client makes (default: all)")
    parser.add_argument("--reads", action="store_true",
                        help="the read cases of issue 30 instead of the honest/hostile phases")
    parser.add_argument("--cases", nargs="+", choices=tuple(_reads_abuse.CASES),
                        default=list(_reads_abuse.CASES), help="with --reads: which cases")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="with --reads: the cases' sizes, as a share of the issue's")
    parser.add_argument("--postgres-url",
                        default=os.environ.get("NUMPARITY_TEST_DATABASE_URL",
                                               "postgresql+psycopg://postgres@127.0.0.1:5432/test"))
    args = parser.parse_args()
    if args.reads:
        workdir = Path(tempfile.mkdtemp(prefix="numparity-abuse-reads-"))
        print(f"{args.backend}: the read cases of issue 30 at scale {args.scale:g}, "
              f"{os.cpu_count()} CPUs", flush=True)
        code = _reads_abuse.run(args, workdir)  # logs kept on an exception
        if code == 0:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"(the servers' logs: {workdir})")
        return code

    template = suite_document("seed")
    workdir = Path(tempfile.mkdtemp(prefix="numparity-abuse-"))
    print(f"{args.backend}: {args.agents} honest agents, {args.seconds:.0f} s a phase, "
          f"{args.stalled} stalled bodies, {os.cpu_count()} CPUs", flush=True)
    try:
        with database(args, workdir) as url, \
                running_server(url, args.workers, workdir / "server.log",
                               token_budget=not args.no_budget) as server:
            env = {**os.environ, "NUMPARITY_DATABASE_URL": url}
            tokens = [honest_token(env, f"honest-{i:03d}") for i in range(args.agents)]
            reader = create_token(env, "--role", "reader")
            seed = upload_document(template, server=server.base_url, token=server.token)
            assert seed.ok, seed
            hostile_tokens = (server.token, honest_token(env, HOSTILE_NODE))
            quiet, _ = run_phase("quiet", server, tokens, reader, hostile_tokens, template,
                                 args, 0, with_hostile=False)
            loud, figures = run_phase("hostile", server, tokens, reader, hostile_tokens,
                                      template, args, 100_000, with_hostile=True)
            ratio = loud.p(0.99) / max(quiet.p(0.99), 1e-9)
            growth = (loud.rss_after - quiet.rss_before) / 2**20
            print(f"\nhonest p99 hostile/quiet {ratio:.2f}x (target <= 2)  read failures "
                  f"{figures['reads_bad']} (target 0)  lost {figures['lost']} (target 0)  "
                  f"RSS growth {growth:.0f} MiB (target < 200)")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
