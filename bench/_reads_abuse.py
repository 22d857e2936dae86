"""The cases of issue 30 for bench/abuse.py (``--reads``): uploads that stay inside every
documented limit, then the reads they used to make slow or huge. Each case starts its own
server on a fresh database and prints its figures against the issue's targets: every
read <= 2 s and <= 16 MiB, server memory growth per request <= 256 MiB, /healthz <= 1 s
while 45 readers hammer the worst pair, disk growth <= 2x the decompressed bytes
accepted, SIGTERM during the worst read ends the server within 5 s.

- traces: 6 nodes upload a result each with a 50,000-op trace (neighbours swapped from
  one node to the next); /divergence, the workload page, /compare of two of them, 45
  readers on a new pair with /healthz and an honest upload timed meanwhile, and a
  SIGTERM during a read of another new pair;
- compare: two runs of 256 results that each point at one stored 4,096-tensor manifest;
  /compare asked until its parts are all computed, again, a deep page, and its page;
- values: 24 tensors of 5.5 million elements with their whole values (~40 KiB of gzip
  each) on each side; one /compare over them as 24 results, then as one result's;
- environments: uploads each with a new env_key and the largest environment document
  the server takes (and one past it); disk growth against the bytes accepted;
- spellings: one token under 8 spellings of its Authorization header, gzip bodies;
- metrics: 40 uploads of 256 made-up workload names each; /metrics' series and size.
"""

from __future__ import annotations

import base64
import copy
import gzip
import hashlib
import json
import os
import secrets
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import torch
from ingest import _EPOCH, running_server, sqlite_size, temporary_database

from numparity_agent._environment import capture_environment, compute_env_key
from numparity_agent._fingerprint import fingerprint

MIB = 1024 * 1024
READ_S, READ_BYTES, GROWTH = 2.0, 16 * MIB, 256 * MIB


def status_memory(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


@dataclass
class Case:
    server: Any
    reader: dict[str, str]
    agent: dict[str, str]
    size: Callable[[], int]  # database bytes on disk
    failures: list[str]

    @property
    def pid(self) -> int:
        return int(self.server.process.pid)

    def read(self, label: str, path: str, **params: Any) -> httpx.Response:
        """One read, timed, with its size and the server's memory growth (peak RSS)."""
        before = status_memory(self.pid, "VmRSS")
        peak_before = status_memory(self.pid, "VmHWM")
        began = time.perf_counter()
        response = httpx.get(self.server.base_url + path, params=params, headers=self.reader,
                             timeout=600)
        elapsed = time.perf_counter() - began
        peak = status_memory(self.pid, "VmHWM")
        growth = max(peak - before, 0) if peak > peak_before else 0
        ok = (response.status_code == 200 and elapsed <= READ_S
              and len(response.content) <= READ_BYTES and growth <= GROWTH)
        pending = ""
        if response.headers.get("content-type", "").startswith("application/json"):
            pending = f" pending {response.json().get('pending', 0)}"
        print(f"  {label:<44} {response.status_code} {elapsed:7.2f} s "
              f"{len(response.content) / 1024:9.1f} KiB  memory +{growth / MIB:6.1f} MiB"
              f"{pending}  {'ok' if ok else 'MISSES A TARGET'}", flush=True)
        if not ok:
            self.failures.append(label)
        return response

    def read_until_computed(self, label: str, path: str, *, asks: int,
                            **params: Any) -> httpx.Response:
        """``read`` asked again while the answer says work is pending (each request
        computes for its computing time, then answers what it has): at most ``asks``."""
        answer = self.read(label, path, **params)
        for ask in range(2, asks + 1):
            if not answer.json().get("pending"):
                return answer
            answer = self.read(f"  ask {ask}", path, **params)
        if answer.json().get("pending"):
            print(f"  still pending after {asks} asks  MISSES A TARGET", flush=True)
            self.failures.append(f"{label}: pending after {asks} asks")
        return answer

    def upload(self, document: dict[str, Any], headers: dict[str, str] | None = None,
               expect: int = 201) -> httpx.Response:
        body = gzip.compress(json.dumps(document).encode(), 1)
        response = httpx.post(self.server.base_url + "/api/v1/runs", content=body, headers={
            **(headers or self.agent), "Content-Type": "application/json",
            "Content-Encoding": "gzip"}, timeout=600)
        if response.status_code != expect:
            raise RuntimeError(f"upload: {response.status_code} {response.text[:300]}")
        return response


@contextmanager
def case(args: Any, workdir: Path, name: str, *, budget: bool = False,
         env: dict[str, str] | None = None) -> Iterator[Case]:
    saved = {key: os.environ.get(key) for key in (env or {})}
    os.environ.update(env or {})
    try:
        with _database(args, workdir, name) as (url, size), \
                running_server(url, 1, workdir / f"{name}.log", token_budget=budget) as server:
            environ = {**os.environ, "NUMPARITY_DATABASE_URL": url}
            import subprocess

            from ingest import _server_command
            reader = subprocess.run([*_server_command(), "token", "create", "--role",
                                     "reader"], env=environ, check=True, capture_output=True,
                                    text=True).stdout.split()[0]
            yield Case(server, {"Authorization": f"Bearer {reader}"},
                       {"Authorization": f"Bearer {server.token}"}, size, [])
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextmanager
def _database(args: Any, workdir: Path, name: str) -> Iterator[tuple[str, Callable[[], int]]]:
    if args.backend == "sqlite":
        path = workdir / f"{name}.db"
        yield f"sqlite:///{path}", sqlite_size(path)
        return
    with temporary_database(args.postgres_url, f"numparity_{name}") as temporary:
        yield temporary.url, temporary.size


# -- documents ---------------------------------------------------------------------------

_ENVIRONMENT = capture_environment()


def stamp(minute: int) -> str:
    from datetime import timedelta
    return (_EPOCH + timedelta(minutes=minute)).isoformat().replace("+00:00", "Z")


def document(node: str, results: list[dict[str, Any]], *, minute: int = 0,
             environment: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"schema": "numparity.run/v1", "run_id": str(uuid.uuid4()),
            "node": {"name": node, "labels": {}}, "agent_version": "bench",
            "started_at": stamp(minute), "finished_at": stamp(minute),
            "environment": environment or _ENVIRONMENT, "results": results}


def result(workload: str, tensors: list[dict[str, Any]] | None = None, *,
           variant: str = "default", manifest: str | None = None,
           trace: str | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"suite": "standard", "workload": workload, "workload_version": 1,
                             "variant": variant, "device": "cpu", "status": "ok",
                             "input_hash": "1" * 64, "param_hash": "2" * 64, "repeats": 1,
                             "repeats_agree": True, "wall_s": 0.01}
    if manifest is not None:
        entry["manifest"] = manifest
    else:
        entry["tensors"] = tensors or []
    if trace is not None:
        entry["trace"] = trace
    return entry


def tensor(name: str, order: int, values: torch.Tensor, kind: str = "layer", *,
           whole: bool = False) -> dict[str, Any]:
    entry = {"name": name, "kind": kind, "order": order, **fingerprint(values)}
    if whole:
        raw = values.contiguous().numpy().astype("<f4").tobytes()
        entry["values"] = {"dtype": "float32", "data": base64.b64encode(raw).decode()}
    return entry


def manifest_hash(tensors: list[dict[str, Any]]) -> str:
    triples = [[t["name"], t["kind"], t["hash"]] for t in sorted(tensors, key=lambda t: t["order"])]
    return hashlib.sha256(json.dumps(triples, separators=(",", ":")).encode()).hexdigest()


def trace_body(ops: int, *, swapped: bool, salt: str) -> dict[str, Any]:
    """``ops`` ops of distinct signatures on the same input, each with an output of its
    own (so every op aligned is an origin); ``swapped``: neighbours swapped."""
    def ref(label: str) -> str:
        return hashlib.sha256(label.encode()).hexdigest()[:16]

    order = [i ^ 1 for i in range(ops)] if swapped else list(range(ops))
    x = ref("x")
    tensors = {x: ["float32", [8]]}
    entries = []
    for i in order:
        out = ref(f"{salt}-{i}")
        tensors[out] = ["float32", [8]]
        entries.append({"op": f"aten.op{i}.default", "module": f"m{i % 97}",
                        "phase": "forward", "in": [x], "out": [out]})
    body: dict[str, Any] = {"format": "numparity.trace/v1", "hash_chars": 16,
                            "tensors": tensors, "ops": entries}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    body["hash"] = hashlib.sha256(canonical.encode()).hexdigest()
    return body


# -- the cases ---------------------------------------------------------------------------

def traces(args: Any, workdir: Path) -> list[str]:
    ops = int(50_000 * args.scale)
    print(f"traces: 6 nodes, a {ops:,}-op trace each (neighbours swapped node to node)",
          flush=True)
    with case(args, workdir, "traces") as c:
        runs = []
        sizes = 0
        for k in range(6):
            body = trace_body(ops, swapped=bool(k % 2), salt=f"node{k}")
            own = tensor("output", 0, torch.full((8,), float(k)), "output")
            doc = document(f"traced-{k}", [result("traced", [own], trace=body["hash"])])
            doc["traces"] = [body]
            sizes += len(gzip.compress(json.dumps(doc).encode(), 1))
            c.upload(doc)
            runs.append(doc["run_id"])
        print(f"  uploaded {sizes / MIB:.2f} MiB gzip", flush=True)
        c.read("/divergence traced/default", "/api/v1/divergence", workload="traced",
               variant="default")
        c.read("/divergence again (kept)", "/api/v1/divergence", workload="traced",
               variant="default")
        c.read("workload page /workloads/traced", "/workloads/traced")
        c.read("/compare two swapped traces", "/api/v1/compare", run_a=runs[0], run_b=runs[1])
        c.read("/compare again (kept)", "/api/v1/compare", run_a=runs[0], run_b=runs[1])
        _hammer(c, runs[2], runs[3])
        _sigterm(c, runs[4], runs[5])
        return c.failures


def _hammer(c: Case, run_a: str, run_b: str) -> None:
    """45 readers on a pair nobody asked for yet; /healthz and an honest upload timed."""
    stop = threading.Event()
    latencies: list[float] = []
    statuses: list[int] = []
    lock = threading.Lock()

    def reader() -> None:
        with httpx.Client(base_url=c.server.base_url, headers=c.reader, timeout=600) as client:
            while not stop.is_set():
                began = time.perf_counter()
                try:
                    status = client.get("/api/v1/compare", params={
                        "run_a": run_a, "run_b": run_b}).status_code
                except httpx.HTTPError:
                    status = 0
                with lock:
                    latencies.append(time.perf_counter() - began)
                    statuses.append(status)

    threads = [threading.Thread(target=reader) for _ in range(45)]
    for thread in threads:
        thread.start()
    time.sleep(0.5)
    health = []
    for _ in range(10):
        began = time.perf_counter()
        httpx.get(c.server.base_url + "/healthz", timeout=60)
        health.append(time.perf_counter() - began)
        time.sleep(0.2)
    began = time.perf_counter()
    honest = document("honest", [result("cnn", [tensor("output", 0, torch.ones(8), "output")])])
    c.upload(honest)
    upload_s = time.perf_counter() - began
    stop.set()
    for thread in threads:
        thread.join()
    ok = max(health) <= 1.0 and max(latencies) <= READ_S and set(statuses) == {200}
    print(f"  45 readers on a new pair: {len(latencies)} reads, statuses "
          f"{sorted(set(statuses))}, max {max(latencies):.2f} s; /healthz max "
          f"{max(health) * 1000:.0f} ms; an honest upload {upload_s:.2f} s  "
          f"{'ok' if ok else 'MISSES A TARGET'}", flush=True)
    if not ok:
        c.failures.append("45 readers")


def _sigterm(c: Case, run_a: str, run_b: str) -> None:
    thread = threading.Thread(target=lambda: _quiet_get(c, run_a, run_b))
    thread.start()
    time.sleep(0.3)  # the read is under way
    began = time.perf_counter()
    c.server.process.send_signal(signal.SIGTERM)
    try:
        c.server.process.wait(timeout=60)
    except Exception:  # noqa: BLE001 (reported below)
        pass
    elapsed = time.perf_counter() - began
    thread.join(60)
    ok = c.server.process.poll() is not None and elapsed <= 5
    print(f"  SIGTERM during a /compare of a new pair: exited in {elapsed:.2f} s  "
          f"{'ok' if ok else 'MISSES A TARGET'}", flush=True)
    if not ok:
        c.failures.append("SIGTERM")


def _quiet_get(c: Case, run_a: str, run_b: str) -> None:
    try:
        httpx.get(c.server.base_url + "/api/v1/compare", headers=c.reader, timeout=60,
                  params={"run_a": run_a, "run_b": run_b})
    except httpx.HTTPError:
        pass


def compare(args: Any, workdir: Path) -> list[str]:
    results, width = int(256 * args.scale) or 1, int(4096 * args.scale) or 1
    print(f"compare: two runs of {results} results, each pointing at one stored "
          f"{width}-tensor manifest", flush=True)
    with case(args, workdir, "compare") as c:
        runs = []
        for side in (0.0, 1e-3):
            generator = torch.Generator().manual_seed(5)
            tensors = [tensor(f"t{i:04d}", i, torch.randn(4, generator=generator) + side)
                       for i in range(width)]
            digest = manifest_hash(tensors)
            doc = document(f"wide-{side}", [result(f"w{k}", tensors) if k == 0 else
                                            result(f"w{k}", manifest=digest)
                                            for k in range(results)])
            c.upload(doc)
            runs.append(doc["run_id"])
        c.read_until_computed("/compare (first page, computing)", "/api/v1/compare",
                              asks=width // 128 + 2, run_a=runs[0], run_b=runs[1])
        c.read("/compare again (kept)", "/api/v1/compare", run_a=runs[0], run_b=runs[1])
        c.read("/compare a deep page of 500", "/api/v1/compare", run_a=runs[0],
               run_b=runs[1], limit=500, offset=results * width // 2)
        c.read("the compare page", "/compare", run_a=runs[0], run_b=runs[1])
        return c.failures


def values(args: Any, workdir: Path) -> list[str]:
    count, elements = 24, int(5_500_000 * args.scale)
    print(f"values: {count} tensors of {elements:,} elements with their whole values a "
          "side", flush=True)
    with case(args, workdir, "values") as c:
        runs, together = [], []
        sent = 0
        for side in (1.0, 1.5):
            entries = []
            for k in range(count):
                values_k = torch.full((elements,), side + k / 1000)
                entry = tensor("output", 0, values_k, "output", whole=True)
                store = document(f"store-{side}-{k}", [result(f"v{k}", [entry])])
                sent += len(gzip.compress(json.dumps(store).encode(), 1))
                c.upload(store)
                entries.append({key: entry[key] for key in ("name", "kind", "order", "hash")})
            doc = document(f"values-{side}", [result(f"v{k}", [entries[k]])
                                              for k in range(count)])
            c.upload(doc)
            runs.append(doc["run_id"])
            # The same tensors as one result's: one pair of `count` tensors.
            doc = document(f"together-{side}", [result("all", [
                {**entry, "name": f"t{k:02d}", "order": k} for k, entry in enumerate(entries)])])
            c.upload(doc)
            together.append(doc["run_id"])
        print(f"  uploaded {sent / count / 2 / 1024:.0f} KiB gzip a tensor", flush=True)
        c.read_until_computed(f"/compare over {count} pairs of whole values",
                              "/api/v1/compare", asks=count + 1, run_a=runs[0],
                              run_b=runs[1])
        c.read("/compare again (kept)", "/api/v1/compare", run_a=runs[0], run_b=runs[1])
        c.read_until_computed(f"/compare of one result of all {count}", "/api/v1/compare",
                              asks=count + 1, run_a=together[0], run_b=together[1])
        return c.failures


def environments(args: Any, workdir: Path) -> list[str]:
    print("environments: uploads each with a new env_key and the largest document taken",
          flush=True)
    with case(args, workdir, "environments", budget=True) as c:
        huge = copy.deepcopy(_ENVIRONMENT)
        huge["padding"] = ["x" * 60_000 for _ in range(500)]  # 30 MB
        huge["env_key"] = compute_env_key(huge)
        refused = c.upload(document("envs", [result("cnn", [tensor(
            "output", 0, torch.ones(8), "output")])], environment=huge), expect=422)
        print(f"  a 30 MB document: {refused.status_code} "
              f"{refused.json()['detail'][0]['msg'][:80]}", flush=True)
        before = c.size()
        accepted = sent = 0
        for k in range(int(10 * max(args.scale, 1))):
            environment = copy.deepcopy(_ENVIRONMENT)
            environment["padding"] = ["x" * 60_000 for _ in range(4)]  # 240 KB
            environment["bench_environment"] = secrets.token_hex(16)
            environment["env_key"] = compute_env_key(environment)
            doc = document("envs", [result("cnn", [tensor("output", 0, torch.ones(8),
                                                          "output")])],
                           minute=k, environment=environment)
            raw = json.dumps(doc).encode()
            while True:
                response = httpx.post(c.server.base_url + "/api/v1/runs",
                                      content=gzip.compress(raw, 1), timeout=60, headers={
                                          **c.agent, "Content-Type": "application/json",
                                          "Content-Encoding": "gzip"})
                if response.status_code != 429:
                    break
                time.sleep(float(response.headers.get("Retry-After", "1")))
            assert response.status_code == 201, response.text
            accepted += len(raw)
            sent += len(gzip.compress(raw, 1))
        growth = c.size() - before
        ok = growth <= 2 * accepted
        print(f"  {k + 1} uploads: {sent / MIB:.2f} MiB gzip, {accepted / MIB:.2f} MiB "
              f"decompressed accepted; disk +{growth / MIB:.2f} MiB = "
              f"{growth / accepted:.2f}x the decompressed bytes (target <= 2)  "
              f"{'ok' if ok else 'MISSES A TARGET'}", flush=True)
        return c.failures if ok else [*c.failures, "disk"]


# (httpx sends no header value with spaces around it; the tests send those too.)
SPELLINGS = ("Bearer {}", "bearer {}", "BEARER {}", "Bearer  {}", "bEaReR {}", "BeArEr   {}",
             "bearer  {}", "BEARER   {}")


def spellings(args: Any, workdir: Path) -> list[str]:
    print("spellings: one token, 8 spellings of its header, 6.5 MiB (decompressed) bodies",
          flush=True)
    with case(args, workdir, "spellings", budget=True) as c:
        token = c.agent["Authorization"].split()[1]
        question = json.dumps({"hashes": ["0" * 64] * 100_000}).encode()  # the most asked
        body, decompressed = gzip.compress(question), len(question)
        accepted = refused = 0
        began = time.perf_counter()
        while time.perf_counter() - began < 5:
            for spelling in SPELLINGS:
                response = httpx.post(c.server.base_url + "/api/v1/fingerprints/missing",
                                      content=body, timeout=60, headers={
                                          "Authorization": spelling.format(token),
                                          "Content-Type": "application/json",
                                          "Content-Encoding": "gzip"})
                if response.status_code == 200:
                    accepted += decompressed
                elif response.status_code == 429:
                    refused += 1
                else:
                    raise RuntimeError(f"{response.status_code} {response.text[:200]}")
        elapsed = time.perf_counter() - began
        # The burst (32 MiB) plus 1 MiB/s.
        allowed = 32 * MIB + elapsed * MIB + decompressed
        ok = accepted <= allowed
        print(f"  {elapsed:.1f} s: {accepted / MIB:.0f} MiB accepted (a budget of 32 MiB + "
              f"1 MiB/s allows {allowed / MIB:.0f}), {refused} refused with 429  "
              f"{'ok' if ok else 'MISSES A TARGET'}", flush=True)
        return [] if ok else ["spellings"]


def metrics(args: Any, workdir: Path) -> list[str]:
    uploads = int(40 * max(args.scale, 0.25))
    print(f"metrics: {uploads} uploads of 256 made-up workload names each", flush=True)
    with case(args, workdir, "metrics", env={"NUMPARITY_METRICS_CACHE_SECONDS": "0"}) as c:
        one = tensor("output", 0, torch.ones(8), "output")
        bare = {key: one[key] for key in ("name", "kind", "order", "hash")}
        c.upload(document("seed", [result("cnn", [one])]))

        def scrape() -> tuple[int, int]:
            text = httpx.get(c.server.base_url + "/metrics", headers=c.reader, timeout=60).text
            return sum(1 for line in text.splitlines() if line.startswith("numparity_groups")
                       ), len(text)

        series0, size0 = scrape()
        for k in range(uploads):
            c.upload(document("made-up", [result(f"made-up-{k}-{j}", [bare])
                                          for j in range(256)], minute=k))
        series, size = scrape()
        ok = series <= 202
        print(f"  numparity_groups series {series0} -> {series}, scrape {size0 / 1024:.1f} -> "
              f"{size / 1024:.1f} KiB ({uploads * 256} keys made up; target: at most 200 "
              f"series and one for the rest)  {'ok' if ok else 'MISSES A TARGET'}", flush=True)
        return [] if ok else ["metrics"]


CASES: dict[str, Callable[[Any, Path], list[str]]] = {
    "traces": traces, "compare": compare, "values": values, "environments": environments,
    "spellings": spellings, "metrics": metrics}


def run(args: Any, workdir: Path) -> int:
    failures = []
    for name in args.cases:
        failures += [f"{name}: {what}" for what in CASES[name](args, workdir)]
    print(f"\n{len(failures)} figures miss a target" + (f": {failures}" if failures else ""))
    return 1 if failures else 0

