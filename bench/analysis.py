"""Analysis benchmark: /divergence, /audit, the dashboard and /metrics on fleets of 100 to
10,000 nodes.

Not run by CI. For each database (SQLite: a temporary file; PostgreSQL: a temporary
database on the server of ``--postgres-url``, dropped afterwards) it starts
``numparity-server serve`` (one worker, the lab's policy file) on a free loopback port,
grows a synthetic lab (bench/_fleet.py: ~16 environments, suspects, flaky nodes, drift,
stale nodes, one or two runs a node) through the real ingest to each size in turn, and
times over HTTP, with a reader token:

- GET /api/v1/divergence?workload=cnn&variant=default
- GET /api/v1/divergence?workload=transformer&variant=strict
- GET /api/v1/audit
- the dashboard's fleet page (``/``, its first 100 nodes) and ``/workloads/cnn``
- GET /metrics (its fleet figures are cached: ``first`` is what a scrape computes)

the first request after loading (``first``) and the best of ``--repeats`` more
(``best``), with the size of each response (``load s``: the seconds it took to grow the
fleet to that size). Every answer is checked against what the
fleet was built to contain (suspects, watch, nondeterministic, stale, drift, policy
violations, groups); a mismatch is printed and makes the exit code 1. On PostgreSQL the
tables are vacuumed and analysed after each load, as autovacuum does in a running lab.

Every request computes its answer: the server runs with the read cache and /metrics'
cache off (``NUMPARITY_READ_CACHE_MAX_AGE_S=0``, ``NUMPARITY_METRICS_CACHE_SECONDS=0``).
Beyond 10,000 nodes the fleet is loaded by bench/_bulk.py (copies of the real ingest's
rows; bench/bulkcheck.py checks that they answer as the real ingest's do).

    .venv/bin/python bench/analysis.py [--sizes 100 1000 10000 | --nodes 100000]
        [--answers N] [--load ingest|bulk] [--db sqlite|postgresql|both]
        [--repeats 3] [--loaders 2] [--profile auto|always|never]
        [--postgres-url postgresql+psycopg://postgres@127.0.0.1:5432/test]

``--answers N``: every key but fp64-reference has N distinct answers, one per build
(bench/_fleet.py). Targets: /audit for 10,000 nodes <= 1 s on PostgreSQL; from 1,000 to
10,000 nodes each endpoint's time grows <= 12x; at 100,000 nodes on PostgreSQL every
endpoint <= 1 s, and from 10,000 to 100,000 each grows <= 5x. With ``--profile auto``
an endpoint that misses a target (or takes over 1 s) is profiled in-process at the
largest size (cProfile around the service function): the time spent in each repository
function, then the top 15 cumulative entries of the whole call tree and of numparity's
own functions.
"""

from __future__ import annotations

import argparse
import cProfile
import inspect
import io
import itertools
import os
import pstats
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx
from _bulk import BulkLoader
from _fleet import POLICY_TOML, Fleet, Loader
from ingest import running_server

from numparity_server.audit import service as audit_service
from numparity_server.auth.service import create_token
from numparity_server.dashboard import service as dashboard_service
from numparity_server.divergence import service as divergence_service
from numparity_server.kit.db import create_engine_for, session_factory
from numparity_server.kit.policy_file import load_policy
from numparity_server.kit.settings import Settings
from numparity_server.metrics import service as metrics_service

AUDIT_TARGET_MS = 1000.0
AUDIT_TARGET_NODES = 10_000
# (from, to, at most): each endpoint's growth between two sizes.
GROWTH_TARGETS = ((1_000, 10_000, 12.0), (10_000, 100_000, 5.0))
# Every endpoint at 100,000 nodes on PostgreSQL, uncached (issue 19).
LAB_TARGET_MS, LAB_TARGET_NODES = 1000.0, 100_000
SLOW_MS = 1000.0
LADDER = (100, 1_000, 10_000, 100_000)


@dataclass(frozen=True)
class Endpoint:
    label: str
    path: str
    params: dict[str, str]
    service: Callable[..., Any]  # what the route calls, for the profile


ENDPOINTS = (
    Endpoint("divergence cnn/default", "/api/v1/divergence",
             {"workload": "cnn", "variant": "default"},
             lambda session, policy: divergence_service.divergence(
                 session=session, suite="standard", workload="cnn", variant="default",
                 tensor="output")),
    Endpoint("divergence transformer/strict", "/api/v1/divergence",
             {"workload": "transformer", "variant": "strict"},
             lambda session, policy: divergence_service.divergence(
                 session=session, suite="standard", workload="transformer",
                 variant="strict", tensor="output")),
    Endpoint("audit", "/api/v1/audit", {},
             lambda session, policy: audit_service.audit(session=session, policy=policy,
                                                         limit=50)),
    # The dashboard's pages (HTML) and the Prometheus scrape. /metrics caches the fleet
    # figures for NUMPARITY_METRICS_CACHE_SECONDS: its "first" is the computation.
    Endpoint("fleet page", "/", {},
             lambda session, policy: dashboard_service.overview(
                 session=session, policy=policy, suite="standard", limit=100, offset=0)),
    Endpoint("workload page cnn", "/workloads/cnn", {},
             lambda session, policy: dashboard_service.workload_page(
                 session=session, policy=policy, suite="standard", workload="cnn",
                 tensor=None)),
    Endpoint("metrics", "/metrics", {},
             lambda session, policy: metrics_service.fleet_snapshot(session=session,
                                                                    policy=policy)),
)


@dataclass
class Timing:
    first_ms: float
    best_ms: float
    size: int


@dataclass
class Row:
    db: str
    nodes: int
    runs: int
    load_s: float
    timings: dict[str, Timing]
    checks: list[tuple[str, int, int]] = field(default_factory=list)

    @property
    def mismatches(self) -> list[str]:
        return [f"{name} {got} != {want}" for name, got, want in self.checks if got != want]


# -- measuring -----------------------------------------------------------------------------

def timed(client: httpx.Client, url: str, params: dict[str, str], repeats: int
          ) -> tuple[Timing, Any]:
    times = []
    response = None
    for _ in range(1 + repeats):
        began = time.perf_counter()
        response = client.get(url, params=params)
        times.append((time.perf_counter() - began) * 1000)
        if response.status_code != 200:
            raise RuntimeError(f"GET {url} {params}: {response.status_code} {response.text}")
    assert response is not None
    answer = (response.json() if response.headers["content-type"].startswith("application/json")
              else response.text)
    return Timing(times[0], min(times[1:] or times), len(response.content)), answer


def checks(expected: dict[str, int], answers: dict[str, Any]) -> list[tuple[str, int, int]]:
    """(what, found, expected) for each count the fleet was built to show."""
    audit = answers["audit"]
    summary = audit["summary"]
    found = [
        ("nodes", summary["nodes"], expected["nodes"]),
        ("suspect", summary["suspect"], expected["suspect"]),
        ("watch", summary["watch"], expected["watch"]),
        ("nondeterministic", summary["nondeterministic"], expected["nondeterministic"]),
        ("stale", summary["stale"], expected["stale"]),
        ("drift", audit["totals"]["drift"], expected["drift"]),
        ("policy", summary["policy_violations"], expected["policy_violations"]),
        ("broken_inputs", summary["broken_inputs"], 0),
    ]
    for label, key in (("divergence cnn/default", "groups cnn/default"),
                       ("divergence transformer/strict", "groups transformer/strict")):
        report = answers[label]
        found.append((key, len(report["groups"]), expected[key]))
        found.append((f"{key.split()[1]} members",
                      sum(group["size"] for group in report["groups"]), expected["nodes"]))
        found.append((f"{key.split()[1]} excluded", report["excluded_total"], 0))
    return found


def measure(db: str, fleet: Fleet, loader: Loader | BulkLoader, base_url: str, token: str,
            size: int, loaded_s: float, repeats: int) -> Row:
    timings: dict[str, Timing] = {}
    answers: dict[str, Any] = {}
    with httpx.Client(base_url=base_url, timeout=600,
                      headers={"Authorization": f"Bearer {token}"}) as client:
        for endpoint in ENDPOINTS:
            timings[endpoint.label], answers[endpoint.label] = timed(
                client, endpoint.path, endpoint.params, repeats)
    row = Row(db, size, loader.runs, loaded_s, timings)
    row.checks = checks(fleet.expected(size), answers)
    return row


@contextmanager
def repository_times() -> Iterator[dict[str, list[float]]]:
    """Wall time of each call of the repositories' functions (the queries, the fetch and
    the rows' shaping), by function; a function's time includes the ones it calls."""
    times: dict[str, list[float]] = {}
    patched: list[tuple[Any, str, Any]] = []

    def timing(label: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def timed_call(*args: Any, **kwargs: Any) -> Any:
            began = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                times.setdefault(label, []).append((time.perf_counter() - began) * 1000)
        return timed_call

    for module_name, module in list(sys.modules.items()):
        if module_name.startswith("numparity_server.") and module_name.endswith(".repository"):
            for name, function in list(vars(module).items()):
                if inspect.isfunction(function) and function.__module__ == module_name:
                    label = f"{module_name.removeprefix('numparity_server.')}.{name}"
                    patched.append((module, name, function))
                    setattr(module, name, timing(label, function))
    try:
        yield times
    finally:
        for module, name, function in patched:
            setattr(module, name, function)


def profile(url: str, policy_file: Path, endpoints: list[Endpoint]) -> str:
    """The service functions behind ``endpoints``, in-process: the warm time with the
    repositories' share, then cProfile's top 15 by cumulative time (the whole call tree,
    then numparity's own functions)."""
    engine = create_engine_for(Settings(database_url=url))
    sessions = session_factory(engine)
    policy = load_policy(policy_file)
    out = io.StringIO()
    try:
        for endpoint in endpoints:
            with sessions() as session:  # warm-up
                endpoint.service(session, policy)
            with sessions() as session, repository_times() as times:
                began = time.perf_counter()
                endpoint.service(session, policy)
                warm_ms = (time.perf_counter() - began) * 1000
            out.write(f"\n-- {endpoint.label}: service function in-process {warm_ms:.0f} ms "
                      "(no profiler), of which in repository functions (queries and rows; "
                      "a function's time includes the ones it calls):\n")
            for label, calls in sorted(times.items(), key=lambda item: -sum(item[1])):
                out.write(f"  {sum(calls):8.0f} ms  {len(calls):3d} call(s)  {label}\n")
            profiler = cProfile.Profile()
            with sessions() as session:
                profiler.enable()
                endpoint.service(session, policy)
                profiler.disable()
            for title, restriction in (("the whole call tree", ()),
                                       ("numparity's functions", (r"/(server|bench)/",))):
                buffer = io.StringIO()
                stats = pstats.Stats(profiler, stream=buffer)
                stats.sort_stats("cumulative").print_stats(*restriction, 15)
                listing = buffer.getvalue()
                listing = listing[listing.index("   ncalls"):].rstrip()
                out.write(f"top 15 cumulative, {title}:\n{listing}\n")
    finally:
        engine.dispose()
    return out.getvalue()


# -- databases -----------------------------------------------------------------------------

@contextmanager
def sqlite_database(workdir: Path) -> Iterator[str]:
    yield f"sqlite:///{workdir / 'analysis.db'}"


@contextmanager
def postgres_database(base_url: str, keep: bool = False) -> Iterator[str]:
    import psycopg
    from sqlalchemy import make_url

    base = make_url(base_url)
    admin_dsn = base.set(drivername="postgresql").render_as_string(hide_password=False)
    name = f"numparity_bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = base.set(drivername="postgresql+psycopg", database=name).render_as_string(
        hide_password=False)
    try:
        yield url
    finally:
        if keep:
            print(f"kept: {url} (drop it with DROP DATABASE \"{name}\")", flush=True)
        else:
            with psycopg.connect(admin_dsn, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def vacuum_analyze(url: str) -> None:
    import psycopg
    from sqlalchemy import make_url

    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute("VACUUM (ANALYZE)")


def reader_token(url: str) -> str:
    engine = create_engine_for(Settings(database_url=url), pooled=False)
    try:
        with session_factory(engine)() as session:
            return create_token(session=session, role="reader", label="bench-analysis").token
    finally:
        engine.dispose()


# -- one database ----------------------------------------------------------------------------

def scenario(db: str, url: str, fleet: Fleet, args: argparse.Namespace, workdir: Path
             ) -> tuple[list[Row], str]:
    policy_file = workdir / "policy.toml"
    policy_file.write_text(POLICY_TOML)
    rows: list[Row] = []
    # Every request computes its answer: the read cache and /metrics' cache are off.
    server_env = {"NUMPARITY_POLICY_FILE": str(policy_file),
                  "NUMPARITY_READ_CACHE_MAX_AGE_S": "0", "NUMPARITY_METRICS_CACHE_SECONDS": "0"}
    previous = {name: os.environ.get(name) for name in server_env}
    os.environ.update(server_env)
    try:
        with running_server(url, 1, workdir / f"{db}.log") as server:
            token = reader_token(url)
            loader: Loader | BulkLoader = Loader(fleet, url, processes=args.loaders)
            if args.load == "bulk":
                loader = BulkLoader(loader)
            loaded = 0
            for size in args.sizes:
                figures = loader.load(loaded, size)
                loaded = size
                if db == "postgresql":
                    vacuum_analyze(url)
                print(f"  {db}: {size:,} nodes, {loader.runs:,} runs: loaded {figures.nodes:,} "
                      f"nodes ({figures.runs:,} runs) in {figures.seconds:.0f} s "
                      f"({figures.runs / max(figures.seconds, 1e-9):.0f} runs/s); "
                      f"load average {os.getloadavg()[0]:.1f}", flush=True)
                row = measure(db, fleet, loader, server.base_url, token, size,
                              figures.seconds, args.repeats)
                rows.append(row)
                print("    " + "  ".join(f"{label} {t.first_ms:.0f}/{t.best_ms:.0f} ms"
                                         for label, t in row.timings.items()), flush=True)
                print("    found/expected: " + ", ".join(
                    f"{name} {got}" + ("" if got == want else f" (EXPECTED {want})")
                    for name, got, want in row.checks), flush=True)
            slow = slow_endpoints(rows, db, args.profile)
            report = profile(url, policy_file, slow) if slow else ""
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return rows, (f"\nprofile: {db}, {rows[-1].nodes:,} nodes" + report) if report else ""


def growth(rows: list[Row], label: str, start: int, stop: int) -> float | None:
    by_size = {row.nodes: row for row in rows}
    if start not in by_size or stop not in by_size:
        return None
    return by_size[stop].timings[label].best_ms / by_size[start].timings[label].best_ms


def growth_misses(rows: list[Row], label: str) -> list[tuple[int, int, float, float]]:
    """(from, to, growth, target) of each growth target this endpoint misses."""
    missed = []
    for start, stop, target in GROWTH_TARGETS:
        ratio = growth(rows, label, start, stop)
        if ratio is not None and ratio > target:
            missed.append((start, stop, ratio, target))
    return missed


def slow_endpoints(rows: list[Row], db: str, mode: str) -> list[Endpoint]:
    if mode == "never" or not rows:
        return []
    if mode == "always":
        return list(ENDPOINTS)
    largest = rows[-1]
    slow = []
    for endpoint in ENDPOINTS:
        best = largest.timings[endpoint.label].best_ms
        if best > SLOW_MS or growth_misses(rows, endpoint.label):
            slow.append(endpoint)
        elif (endpoint.label == "audit" and db == "postgresql"
              and largest.nodes >= AUDIT_TARGET_NODES and best > AUDIT_TARGET_MS):
            slow.append(endpoint)
    return slow


# -- report --------------------------------------------------------------------------------

def table(rows: list[Row]) -> list[str]:
    heads = [("/divergence", "cnn/default"), ("/divergence", "transformer/strict"),
             ("/audit", ""), ("/ (fleet page)", "first 100 nodes"),
             ("/workloads/cnn", ""), ("/metrics", "")]
    lines = [f"{'':<35}" + "".join(f"{head[0]:>28}    " for head in heads),
             f"{'':<35}" + "".join(f"{head[1]:>28}    " for head in heads),
             f"{'db':<11}{'nodes':>8}{'runs':>8}{'load s':>8}"
             + f"{'first ms':>10}{'best ms':>9}{'bytes':>9}    " * len(heads)]
    for row in rows:
        cells = "".join(f"{t.first_ms:>10.0f}{t.best_ms:>9.0f}{t.size:>9}    "
                        for t in row.timings.values())
        lines.append(f"{row.db:<11}{row.nodes:>8,}{row.runs:>8,}{row.load_s:>8.0f}{cells}")
    return [line.rstrip() for line in lines]


def verdicts(rows: list[Row]) -> list[str]:
    lines = []
    for db in dict.fromkeys(row.db for row in rows):
        mine = [row for row in rows if row.db == db]
        targets = {(start, stop): target for start, stop, target in GROWTH_TARGETS}
        for earlier, later in itertools.pairwise(mine):
            ratios = ", ".join(
                f"{label} {later.timings[label].best_ms / earlier.timings[label].best_ms:.1f}x"
                for label in later.timings)
            target = targets.get((earlier.nodes, later.nodes))
            lines.append(f"growth {db} {earlier.nodes:,} -> {later.nodes:,} nodes "
                         f"({later.nodes / earlier.nodes:.0f}x nodes)"
                         + (f" (target <= {target:.0f}x)" if target else "") + f": {ratios}")
        for endpoint in ENDPOINTS:
            for start, stop, target in GROWTH_TARGETS:
                ratio = growth(mine, endpoint.label, start, stop)
                if ratio is not None:
                    state = "met" if ratio <= target else "MISSED"
                    lines.append(f"target {db} {endpoint.label} growth {start:,}->{stop:,} "
                                 f"{ratio:.1f}x <= {target:.0f}x: {state}")
        audit = [row for row in mine if row.nodes == AUDIT_TARGET_NODES]
        if db == "postgresql" and audit:
            best = audit[0].timings["audit"].best_ms
            state = "met" if best <= AUDIT_TARGET_MS else "MISSED"
            lines.append(f"target postgresql /audit at {AUDIT_TARGET_NODES:,} nodes "
                         f"{best:.0f} ms <= {AUDIT_TARGET_MS:.0f} ms: {state}")
        lab = [row for row in mine if row.nodes == LAB_TARGET_NODES]
        if db == "postgresql" and lab:
            for label, timing in lab[0].timings.items():
                state = "met" if timing.best_ms <= LAB_TARGET_MS else "MISSED"
                lines.append(f"target postgresql {label} at {LAB_TARGET_NODES:,} nodes "
                             f"{timing.best_ms:.0f} ms <= {LAB_TARGET_MS:.0f} ms: {state}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1_000, 10_000])
    parser.add_argument("--nodes", type=int,
                        help="the largest size; the sizes are then 100, 1,000, 10,000 and "
                             "100,000 up to it (and it)")
    parser.add_argument("--answers", type=int, default=0,
                        help="distinct answers per key (one build each); default: the "
                             "environments' own (cnn/default 8)")
    parser.add_argument("--load", choices=("ingest", "bulk"),
                        help="the real ingest, or bench/_bulk.py's copies of it (default: "
                             "bulk beyond 10,000 nodes)")
    parser.add_argument("--db", choices=("sqlite", "postgresql", "both"), default="both")
    parser.add_argument("--repeats", type=int, default=3, help="timed requests after the first")
    parser.add_argument("--loaders", type=int, default=2, help="ingest processes")
    parser.add_argument("--profile", choices=("auto", "always", "never"), default="auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--history", type=int, default=0,
                        help="older hourly runs of every steady node (default 0)")
    parser.add_argument("--keep-database", action="store_true",
                        help="leave PostgreSQL's database in place and print its URL (to "
                             "profile or query the fleet afterwards)")
    parser.add_argument("--postgres-url",
                        default=os.environ.get("NUMPARITY_TEST_DATABASE_URL",
                                               "postgresql+psycopg://postgres@127.0.0.1:5432/test"))
    args = parser.parse_args()
    if args.nodes:
        args.sizes = [size for size in LADDER if size < args.nodes] + [args.nodes]
    args.sizes = sorted(set(args.sizes))
    args.load = args.load or ("bulk" if args.sizes[-1] > 10_000 else "ingest")

    began = time.monotonic()
    fleet = Fleet(now=datetime.now(timezone.utc).replace(microsecond=0), seed=args.seed,
                  history=args.history, answers=args.answers)
    expected = fleet.expected(args.sizes[-1])
    print(f"fleet: {len(fleet.envs)} environments (+{len(fleet.environments) - len(fleet.envs)} "
          f"before a driver upgrade), {len(fleet.answers)} distinct answers; at "
          f"{args.sizes[-1]:,} nodes: {expected['runs']:,} runs, {expected['suspect']} "
          f"suspects, {expected['watch']} watch, {expected['nondeterministic']} "
          f"nondeterministic, {expected['stale']} stale, {expected['drift']} drift "
          f"(built in {time.monotonic() - began:.1f} s); {os.cpu_count()} CPUs", flush=True)

    rows: list[Row] = []
    profiles: list[str] = []
    workdir = Path(tempfile.mkdtemp(prefix="numparity-bench-analysis-"))
    try:
        for db in ("sqlite", "postgresql"):
            if args.db not in (db, "both"):
                continue
            database = (sqlite_database(workdir) if db == "sqlite"
                        else postgres_database(args.postgres_url, args.keep_database))
            with database as url:
                found, report = scenario(db, url, fleet, args, workdir)
            rows += found
            profiles.append(report)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    print()
    for line in table(rows) + [""] + verdicts(rows):
        print(line)
    broken = [f"{row.db} {row.nodes:,}: {', '.join(row.mismatches)}"
              for row in rows if row.mismatches]
    print("checks: " + ("; ".join(broken) if broken else
                        "every count found as the fleet was built (see found/expected above)"))
    for report in profiles:
        if report:
            print(report)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
