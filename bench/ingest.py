"""Ingest benchmark: concurrent agents uploading full-suite run documents over HTTP.

Not run by CI. Starts ``numparity-server serve`` as a subprocess on a free loopback port,
on SQLite (a temporary file) and on PostgreSQL (a temporary database on the server of
``--postgres-url``, dropped afterwards; ``--pg-workers`` server processes), and measures
two kinds of run:

- known environment: identical tensors to what the server already has, uploaded the way
  the agent uploads (``numparity_agent.testing.upload_document``) by a node in its steady
  state: its spool remembers the manifests of its previous run, so each result travels
  as its manifest hash, in one request;
- known environment, new node: the same tensors from a node the server has not seen,
  which first asks which manifests the server lacks;
- new environment: every hash new, so every fingerprint travels and is stored.

Documents are the size of the full standard suite (6 workloads x 6 variants, ~400
tensors), fingerprinted with the agent's own functions, in the exact wire format. New
environments reuse the large tensors' fingerprints under fresh random hashes (the server
can check only what carries its values); a tensor that carries its values (at most 4,096
elements) gets a few low mantissa bits changed and is fingerprinted again by the agent's
``fingerprint`` (the server checks the values' hash and their stats), so generating
them stays cheap. Bodies are prepared before the clock starts so the client, which
shares the machine's cores with the server, stays lean.

    .venv/bin/python bench/ingest.py [--concurrency 8] [--known 300] [--new 60]
        [--backends sqlite postgresql] [--postgres-url postgresql+psycopg://...]

Prints runs/s, p50/p99 latency per run (the question and the upload), bytes uploaded
per run (request bodies as sent: the hash question plus the gzip document) and bytes
stored per run (database growth / runs).
"""

from __future__ import annotations

import argparse
import base64
import copy
import gzip
import json
import math
import os
import secrets
import shutil
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import torch

from numparity_agent._environment import compute_env_key
from numparity_agent.testing import (
    KnownManifests,
    build_document,
    capture_environment,
    fingerprint,
    manifest_hash,
    read_knobs,
    upload_document,
)

VARIANTS = ("default", "strict", "tf32", "fp16-autocast", "bf16-autocast", "fp64-reference")
VARIANT_DTYPES = {"fp16-autocast": torch.float16, "bf16-autocast": torch.bfloat16,
                  "fp64-reference": torch.float64}

# (name, kind, shape) per workload: ~11 tensors per result, ~400 for the suite; layer
# activations at the suite's real sizes, outputs and losses small enough for `values`.
WORKLOADS: dict[str, list[tuple[str, str, tuple[int, ...]]]] = {
    "mlp": [("input_norm", "layer", (64, 784)), ("fc1", "layer", (64, 512)),
            ("act1", "layer", (64, 512)),
            ("fc2", "layer", (64, 256)), ("act2", "layer", (64, 256)),
            ("fc3", "layer", (64, 10)), ("output", "output", (64, 10))],
    "cnn": [("conv1", "layer", (64, 32, 24, 24)), ("relu1", "layer", (64, 32, 24, 24)),
            ("pool1", "layer", (64, 32, 12, 12)), ("conv2", "layer", (64, 64, 8, 8)),
            ("relu2", "layer", (64, 64, 8, 8)), ("pool2", "layer", (64, 64, 4, 4)),
            ("fc1", "layer", (64, 512)), ("relu3", "layer", (64, 512)),
            ("fc2", "layer", (64, 10)), ("output", "output", (64, 10))],
    "transformer": [(f"blocks.{b}.{part}", "layer", (8, 32, 128))
                    for b in range(2)
                    for part in ("ln1", "attn.qkv", "attn.q", "attn.k", "attn.v",
                                 "attn.softmax", "attn.out", "ln2", "ff.fc1", "ff.fc2")]
    + [("output", "output", (8, 32, 16))],
    "lstm": [("embedding", "layer", (16, 32, 64)), ("lstm", "layer", (16, 32, 128)),
             ("lstm.h_n", "layer", (1, 32, 128)), ("lstm.c_n", "layer", (1, 32, 128)),
             ("dropout", "layer", (32, 128)), ("head", "layer", (32, 10)),
             ("output", "output", (32, 10))],
    "train": [*((f"loss.{s}", "loss", ()) for s in range(4)),
              *((f"grad.{p}", "grad", shape) for p, shape in
                (("fc1.weight", (256, 128)), ("fc1.bias", (256,)), ("fc2.weight", (10, 256)),
                 ("fc2.bias", (10,)))),
              *((f"param.{p}", "param", shape) for p, shape in
                (("fc1.weight", (256, 128)), ("fc1.bias", (256,)), ("fc2.weight", (10, 256)),
                 ("fc2.bias", (10,))))],
    "probes": [("matmul_k4096", "probe", (64, 64)), ("conv", "probe", (8, 16, 14, 14)),
               ("long_sum", "probe", (1,)), ("index_add", "probe", (1024,)),
               ("softmax_fp16", "probe", (16, 256)), ("layernorm_fp16", "probe", (16, 256)),
               ("cumsum", "probe", (4096,)), ("tf32_matmul", "probe", (64, 64)),
               ("bmm", "probe", (4, 32, 32)), ("sum_fp16", "probe", (1,))],
}


def suite_document(node: str) -> dict[str, Any]:
    """One full-suite run document, fingerprinted by the agent's own code."""
    generator = torch.Generator().manual_seed(1234)
    environment = capture_environment()
    knobs = read_knobs()
    results = []
    for workload, specs in WORKLOADS.items():
        by_variant: dict[str, list[dict[str, Any]]] = {}
        for variant in VARIANTS:
            if variant == "strict":  # identical to default on a CPU node: shared hashes
                by_variant[variant] = by_variant["default"]
                continue
            dtype = VARIANT_DTYPES.get(variant, torch.float32)
            by_variant[variant] = [
                {"name": name, "kind": kind, "order": order,
                 **fingerprint(torch.randn(shape, generator=generator).to(dtype))}
                for order, (name, kind, shape) in enumerate(specs)
            ]
        for variant in VARIANTS:
            results.append({
                "suite": "standard", "workload": workload, "workload_version": 1,
                "variant": variant, "device": "cpu", "status": "ok",
                "dtype": str(VARIANT_DTYPES.get(variant, torch.float32)).removeprefix("torch."),
                "input_hash": secrets.token_hex(32), "param_hash": secrets.token_hex(32),
                "repeats": 2, "repeats_agree": True, "wall_s": 0.05,
                "wall_s_repeats": [0.05, 0.05], "knobs": knobs,
                "tensors": by_variant[variant],
            })
    return build_document(node=node, labels={"rack": "b2"}, environment=environment,
                          results=results, started_at="2026-11-21T10:00:00Z",
                          finished_at="2026-11-21T10:00:41Z")


_EPOCH = (datetime.now(timezone.utc) - timedelta(days=30)).replace(second=0, microsecond=0)


def as_run(template: dict[str, Any], node: str, minute: int) -> dict[str, Any]:
    """The template as another node's run (shares everything but the run's identity)."""
    # Minutes after a start in the past: the server refuses times ahead of its clock.
    stamp = (_EPOCH + timedelta(minutes=minute)).isoformat().replace("+00:00", "Z")
    return {**template, "run_id": str(uuid.uuid4()), "node": {"name": node, "labels": {}},
            "started_at": stamp, "finished_at": stamp}


def as_new_environment(template: dict[str, Any], node: str, minute: int) -> dict[str, Any]:
    """The template on an environment the server has never seen: every hash new."""
    document = copy.deepcopy(as_run(template, node, minute))
    # Another environment document (the server derives the key from it, design §3.1).
    document["environment"]["bench_environment"] = secrets.token_hex(16)
    document["environment"]["env_key"] = compute_env_key(document["environment"])
    renamed: dict[str, dict[str, Any]] = {}
    for result in document["results"]:
        for tensor in result["tensors"]:
            if tensor["hash"] not in renamed:
                renamed[tensor["hash"]] = _new_bytes(tensor)
            tensor.update(renamed[tensor["hash"]])
    return document


def _new_bytes(tensor: dict[str, Any]) -> dict[str, Any]:
    """A tensor's fingerprint fields for other bytes. One without values gets a fresh hash
    (the server cannot check it). One that carries its values (at most VALUES_MAX
    elements) gets new values: random low mantissa bits in its first elements, so they
    stay finite and of the same magnitude, fingerprinted again by the agent's own
    ``fingerprint`` (hash, stats, sketch, sample and values agree, as the server checks)."""
    values = tensor.get("values")
    if values is None:
        return {"hash": secrets.token_hex(32)}
    dtype = getattr(torch, tensor["dtype"])
    raw = bytearray(base64.b64decode(values["data"]))
    width = dtype.itemsize
    bits = np.frombuffer(raw, dtype=np.dtype(f"<u{width}"))  # a view: writes go to raw
    changed = min(bits.size, 4)
    mantissa = min(int(-math.log2(torch.finfo(dtype).eps)), 16)
    noise = np.frombuffer(secrets.token_bytes(changed * width), dtype=bits.dtype).copy()
    noise[0] |= 1  # never the template's bytes (a bfloat16 scalar has 7 mantissa bits)
    bits[:changed] ^= noise & bits.dtype.type((1 << mantissa) - 1)
    elements = torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)
    return fingerprint(elements.reshape(tensor["shape"]))


# -- server ------------------------------------------------------------------------------

def _server_command() -> list[str]:
    script = Path(sys.executable).with_name("numparity-server")
    return [str(script)] if script.exists() else [sys.executable, "-m", "numparity_server.cli"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Server:
    base_url: str
    token: str
    process: subprocess.Popen[bytes]


@contextmanager
def running_server(database_url: str, workers: int, log_path: Path, *,
                   token_budget: bool = False) -> Iterator[Server]:
    """The server, with an agent token; ``token_budget`` False turns off the per-token byte
    budget (design §3.2): the benchmarks' one token stands for a whole fleet."""
    env = {**os.environ, "NUMPARITY_DATABASE_URL": database_url}
    if not token_budget:
        env["NUMPARITY_TOKEN_BYTES_PER_S"] = "0"
    cli = _server_command()
    subprocess.run([*cli, "migrate"], env=env, check=True, capture_output=True)
    token = subprocess.run([*cli, "token", "create", "--role", "agent", "--label", "bench"],
                           env=env, check=True, capture_output=True, text=True).stdout.strip()
    port = _free_port()
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [*cli, "serve", "--port", str(port), "--workers", str(workers),
             "--log-level", "warning"], env=env, stdout=log, stderr=subprocess.STDOUT)
    server = Server(f"http://127.0.0.1:{port}", token, process)
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"server exited:\n{log_path.read_text()}")
            try:
                if httpx.get(server.base_url + "/readyz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"server not ready:\n{log_path.read_text()}")
            time.sleep(0.1)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# -- load --------------------------------------------------------------------------------

@dataclass
class Figures:
    runs: int
    failed: int
    seconds: float
    latencies: list[float]
    bytes_sent: int
    bytes_stored: int
    server_cpu_s: float = 0.0
    client_cpu_s: float = 0.0

    def line(self, label: str) -> str:
        done = max(self.runs - self.failed, 1)
        lat = sorted(self.latencies) or [0.0]
        p99 = lat[min(len(lat) - 1, int(round(0.99 * (len(lat) - 1))))]
        return (f"{label:<34} runs {self.runs:4d} (failed {self.failed}) "
                f"{self.runs / self.seconds:7.1f} runs/s  "
                f"p50 {statistics.median(lat) * 1000:7.1f} ms  p99 {p99 * 1000:7.1f} ms  "
                f"uploaded {self.bytes_sent / done / 1024:8.1f} KiB/run  "
                f"stored {self.bytes_stored / done / 1024:8.1f} KiB/run  "
                f"CPU ms/run server {self.server_cpu_s / done * 1000:5.1f} "
                f"client {self.client_cpu_s / done * 1000:5.1f}")


def load(server: Server, jobs: list[Callable[[httpx.Client], int]], *, concurrency: int,
         time_cap: float, size: Callable[[], int]) -> Figures:
    """Run the jobs on `concurrency` threads, each with its own connection."""
    local = threading.local()
    sent = [0]
    sent_lock = threading.Lock()
    clients: list[httpx.Client] = []

    def count(request: httpx.Request) -> None:
        with sent_lock:
            sent[0] += len(request.content)

    def client() -> httpx.Client:
        if not hasattr(local, "client"):
            local.client = httpx.Client(timeout=120, event_hooks={"request": [count]})
            clients.append(local.client)
        return local.client

    start = time.monotonic()
    latencies: list[float] = []
    failures = [0]

    def one(job: Callable[[httpx.Client], int]) -> None:
        if time.monotonic() - start > time_cap:
            return
        began = time.perf_counter()
        status = job(client())
        latencies.append(time.perf_counter() - began)
        if status not in (200, 201):
            failures[0] += 1
            if failures[0] <= 3:
                print(f"  upload answered {status}", file=sys.stderr)

    before = size()
    cpu_before = server_cpu_seconds(server.process.pid)
    client_before = time.process_time()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, jobs))
    seconds = time.monotonic() - start
    cpu = server_cpu_seconds(server.process.pid) - cpu_before
    client_cpu = time.process_time() - client_before
    stored = size() - before
    for c in clients:
        c.close()
    return Figures(len(latencies), failures[0], seconds, latencies, sent[0], stored, cpu,
                   client_cpu)


def server_cpu_seconds(pid: int) -> float:
    """CPU time of the server process and its workers (not the database's): a figure that,
    unlike runs/s, hardly depends on what else the machine is doing."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    pids = [pid]
    while pids:
        current = pids.pop()
        try:
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / ticks  # utime + stime
        pids.extend(int(child) for child in children)
    return total


def upload_job(server: Server, document: dict[str, Any], gzipped_full: bytes | None = None,
               known: KnownManifests | None = None) -> Callable[[httpx.Client], int]:
    def job(client: httpx.Client) -> int:
        outcome = upload_document(document, server=server.base_url, token=server.token,
                                  client=client, gzipped_full=gzipped_full, known=known)
        return outcome.status or 0
    return job


def node_memory(server: Server, template: dict[str, Any]) -> KnownManifests:
    """What a node's spool remembers after its previous run: the manifests it stored."""
    known = KnownManifests(None, server.base_url)
    known.remember([manifest_hash(r["tensors"]) for r in template["results"] if r.get("tensors")])
    return known


def scenario(label: str, database_url: str, workers: int, size: Callable[[], int],
             template: dict[str, Any], args: argparse.Namespace, workdir: Path) -> list[str]:
    lines = []
    with running_server(database_url, workers, workdir / f"{label}.log") as server:
        seed = upload_document(template, server=server.base_url, token=server.token)
        assert seed.ok, seed
        nodes = [f"node-{i:04d}" for i in range(args.nodes)]
        # A node in its steady state: the server has its last run (uploaded first, not
        # measured) and its spool remembers that run's manifests.
        memory = node_memory(server, template)
        load(server, [upload_job(server, as_run(template, node, 0), known=memory)
                      for node in nodes], concurrency=args.concurrency, time_cap=args.time_cap,
             size=size)
        steady = [upload_job(server, as_run(template, nodes[i % len(nodes)], i + 1),
                             known=memory) for i in range(args.known)]
        figures = load(server, steady, concurrency=args.concurrency, time_cap=args.time_cap,
                       size=size)
        lines.append(figures.line(f"{label} known environment"))
        print(lines[-1], flush=True)
        # A node new to the server on a known environment: it asks first.
        first = [upload_job(server, as_run(template, f"first-{i:04d}", 10_000 + i))
                 for i in range(args.known // 3)]
        figures = load(server, first, concurrency=args.concurrency, time_cap=args.time_cap,
                       size=size)
        lines.append(figures.line(f"{label} known env, new node"))
        print(lines[-1], flush=True)

        documents = [as_new_environment(template, f"new-{i:04d}", i + 1)
                     for i in range(args.new)]
        new = [upload_job(server, d, gzip.compress(json.dumps(d, separators=(",", ":"))
                                                   .encode(), compresslevel=6))
               for d in documents]
        figures = load(server, new, concurrency=args.concurrency, time_cap=args.time_cap,
                       size=size)
        lines.append(figures.line(f"{label} new environment"))
        print(lines[-1], flush=True)
    return lines


def sqlite_size(path: Path) -> Callable[[], int]:
    def size() -> int:
        with sqlite3.connect(path) as connection:
            connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        wal = path.with_name(path.name + "-wal")
        return path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)
    return size


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--known", type=int, default=300, help="runs on a known environment")
    parser.add_argument("--new", type=int, default=60, help="runs on new environments")
    parser.add_argument("--nodes", type=int, default=100, help="distinct nodes of known runs")
    parser.add_argument("--time-cap", type=float, default=120.0, help="seconds per scenario")
    parser.add_argument("--backends", nargs="+", default=["sqlite", "postgresql"])
    parser.add_argument("--postgres-url",
                        default=os.environ.get("NUMPARITY_TEST_DATABASE_URL",
                                               "postgresql+psycopg://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--pg-workers", type=int, default=2)
    args = parser.parse_args()

    began = time.monotonic()
    template = suite_document("seed")
    tensors = sum(len(r["tensors"]) for r in template["results"])
    full = json.dumps(template, separators=(",", ":")).encode()
    print(f"document: {len(template['results'])} results, {tensors} tensors, "
          f"{len(full) / 1024:.0f} KiB JSON, {len(gzip.compress(full, 6)) / 1024:.0f} KiB gzip "
          f"(built in {time.monotonic() - began:.1f} s); concurrency {args.concurrency}, "
          f"{os.cpu_count()} CPUs", flush=True)

    lines: list[str] = []
    workdir = Path(tempfile.mkdtemp(prefix="numparity-bench-"))
    try:
        if "sqlite" in args.backends:
            path = workdir / "bench.db"
            lines += scenario("sqlite", f"sqlite:///{path}", 1, sqlite_size(path), template,
                              args, workdir)
        if "postgresql" in args.backends:
            lines += postgres_scenarios(args, template, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print("\nsummary")
    for line in lines:
        print(line)
    return 0


@dataclass
class TemporaryDatabase:
    url: str  # SQLAlchemy URL (psycopg 3)
    size: Callable[[], int]  # bytes on disk


@contextmanager
def temporary_database(postgres_url: str, prefix: str) -> Iterator[TemporaryDatabase]:
    """A new PostgreSQL database on the server of ``postgres_url``, dropped afterwards."""
    import psycopg
    from sqlalchemy import make_url

    base = make_url(postgres_url)
    admin_dsn = base.set(drivername="postgresql").render_as_string(hide_password=False)
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')

    def size() -> int:
        with psycopg.connect(admin_dsn, autocommit=True) as admin:
            row = admin.execute("SELECT pg_database_size(%s)", (name,)).fetchone()
        return int(row[0]) if row else 0

    try:
        url = base.set(drivername="postgresql+psycopg", database=name)
        yield TemporaryDatabase(url.render_as_string(hide_password=False), size)
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def postgres_scenarios(args: argparse.Namespace, template: dict[str, Any], workdir: Path
                       ) -> list[str]:
    with temporary_database(args.postgres_url, "numparity_bench") as database:
        return scenario(f"postgresql x{args.pg_workers}", database.url, args.pg_workers,
                        database.size, template, args, workdir)


if __name__ == "__main__":
    sys.exit(main())
