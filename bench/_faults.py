"""A fleet of agents uploading through faults: the scenario of ``bench/fleet.py``, shared
with its smaller version in the test suite (``tests/e2e/test_fleet_faults.py``).

Everything runs on loopback:

- a PostgreSQL instance of its own (``initdb`` and ``pg_ctl`` from
  ``/usr/lib/postgresql/*/bin``, or ``NUMPARITY_PG_BIN``, into a temporary folder, on a
  free port, trust authentication), so the scenario can stop and start it freely; as
  root, its commands run as the ``postgres`` system user (``initdb`` refuses root);
- two ``numparity-server serve`` processes (one worker each) on two ports, sharing it;
- simulated agents: threads in a few agent processes (this file run as a script), each
  with its own spool. Every 1-2 s (jittered) an agent writes a new run to its spool
  with the agent's own ``spool_document`` and then uploads what is spooled, oldest
  first, with the agent's own ``send_spooled`` (which deletes a stored run, keeps a run
  on an unreachable server or a 5xx, and moves a refused one to ``rejected/``). Each
  upload picks one of the two servers at random, as a balancer would. After a failure
  worth retrying an agent stops and backs off as the agent's flush does (1, 2, 4 ... 30
  s, half to all of it, at least the server's Retry-After) while it goes on spooling a
  run every 1-2 s. A run is the template document (the
  ``cnn`` and ``probes`` workloads in ``default`` and ``strict``, 40 tensors
  fingerprinted by the agent's own code, as ``make demo`` runs them) under a new
  ``run_id``; now and then one comes on a new environment (new ``env_key``, every
  tensor hash new), which uploads every fingerprint;
- the faults, on the scenario's clock: the database stopped (``pg_ctl stop -m fast``)
  for a while and started again; one server process killed with SIGKILL and started
  again on the same port a few seconds later;
- after the load every agent flushes until its spool is empty (bounded).

Then it counts, from the agents' records, the spools and the ``runs`` table read
straight from the database: runs sent, stored, still spooled, lost (sent but neither
stored nor spooled), duplicated (a run_id stored twice, or a stored run nobody sent),
incomplete (stored without all its results), documents set aside (``rejected/``,
``quarantine/``, any folder of a spool), every upload's outcome and latency.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import random
import resource
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from numparity_agent._environment import compute_env_key
from numparity_agent.testing import send_spooled, spool_document, spooled, utc_now
from numparity_server.kit.net import free_port

PG_BIN_ENV = "NUMPARITY_PG_BIN"
TEMPLATE_WORKLOADS = ("cnn", "probes")
TEMPLATE_VARIANTS = ("default", "strict")
BACKOFF_CAP_S = 30.0


# -- PostgreSQL of its own ---------------------------------------------------------------

class PostgresUnavailable(RuntimeError):
    """No PostgreSQL binaries (or no user to run them as): the scenario cannot run."""


def find_postgres_bin() -> Path:
    """The folder of ``initdb``, ``pg_ctl`` and ``postgres``: ``NUMPARITY_PG_BIN``, the
    newest ``/usr/lib/postgresql/*/bin``, or the ``PATH``."""
    candidates: list[Path] = []
    if os.environ.get(PG_BIN_ENV):
        candidates.append(Path(os.environ[PG_BIN_ENV]))
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin"),
                      key=lambda p: [int(x) for x in p.parent.name.split(".") if x.isdigit()],
                      reverse=True)
    candidates += versions
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(on_path).parent)
    for folder in candidates:
        if all(os.access(folder / name, os.X_OK) for name in ("initdb", "pg_ctl", "postgres")):
            return folder
    raise PostgresUnavailable(
        "no PostgreSQL binaries (initdb, pg_ctl, postgres) in "
        f"${PG_BIN_ENV}, /usr/lib/postgresql/*/bin or on the PATH")



class PostgresInstance:
    """``initdb`` into a temporary folder, ``pg_ctl start`` on a free loopback port; stop
    and start at will; ``close()`` (also at exit) stops it and removes the folder."""

    DATABASE = "numparity"

    def __init__(self) -> None:
        self.bin = find_postgres_bin()
        self._prefix: list[str] = []
        owner: tuple[int, int] | None = None
        if os.geteuid() == 0:  # initdb refuses root: run everything as `postgres`
            import pwd

            try:
                entry = pwd.getpwnam("postgres")
            except KeyError:
                raise PostgresUnavailable("running as root and there is no `postgres` user "
                                          "to run initdb as") from None
            owner = (entry.pw_uid, entry.pw_gid)
            runuser = shutil.which("runuser")
            self._prefix = [runuser, "-u", "postgres", "--"] if runuser else []
        # Its own folder in the system's temporary directory (not under a 0700 folder of
        # root's, which `postgres` could not enter).
        self.root = Path(tempfile.mkdtemp(prefix="numparity-fleet-pg-"))
        if owner:
            os.chown(self.root, *owner)
        self.data = self.root / "data"
        self.log_path = self.root / "postgres.log"
        self.port = free_port()
        self._closed = False
        atexit.register(self.close)
        self.version = ""

    def _command(self, *args: str) -> list[str]:
        if os.geteuid() != 0:
            return list(args)
        if self._prefix:
            return [*self._prefix, *args]
        return ["su", "postgres", "-s", "/bin/sh", "-c", shlex.join(args)]

    def _run(self, *args: str, timeout: float = 120) -> str:
        done = subprocess.run(self._command(*args), cwd=self.root, capture_output=True,
                              text=True, timeout=timeout, start_new_session=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}):\n"
                               f"{done.stdout}{done.stderr}\n{self.log()}")
        return done.stdout

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def init(self) -> None:
        self._run(str(self.bin / "initdb"), "-D", str(self.data), "-A", "trust",
                  "-U", "postgres", "-E", "UTF8", "--locale=C", "--no-sync")
        self.version = (self.data / "PG_VERSION").read_text().strip()
        self.start()
        import psycopg

        with psycopg.connect(f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres",
                             autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {self.DATABASE}")

    def start(self) -> None:
        options = (f"-k {self.root} -c listen_addresses=127.0.0.1 -p {self.port} "
                   "-c max_connections=200")
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.log_path),
                  "-w", "-t", "60", "-o", options, "start")

    def stop(self, mode: str = "fast") -> None:
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w",
                  "-t", "60", "stop")

    @property
    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{self.DATABASE}"

    @property
    def dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={self.DATABASE}"

    def close(self) -> None:
        """Stop it (immediately) and remove its folder; safe to call more than once."""
        if self._closed:
            return
        self._closed = True
        try:
            if self.running:
                try:
                    self.stop("immediate")
                except (RuntimeError, subprocess.TimeoutExpired, OSError):
                    self._kill_postmaster()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def _kill_postmaster(self) -> None:
        try:
            pid = int((self.data / "postmaster.pid").read_text().split()[0])
            os.kill(pid, signal.SIGKILL)
        except (OSError, ValueError, IndexError):
            pass


# -- server processes ----------------------------------------------------------------------

def server_command() -> list[str]:
    script = Path(sys.executable).with_name("numparity-server")
    return [str(script)] if script.exists() else [sys.executable, "-m", "numparity_server.cli"]


def server_cli(database_url: str, *args: str) -> str:
    env = {**os.environ, "NUMPARITY_DATABASE_URL": database_url}
    done = subprocess.run([*server_command(), *args], env=env, capture_output=True, text=True,
                          timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"numparity-server {' '.join(args)} failed:\n{done.stderr}")
    return done.stdout


class ServerProcess:
    """``numparity-server serve`` (one worker) on a fixed loopback port; killed and started
    again on the same port."""

    def __init__(self, database_url: str, log_path: Path) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        # One token stands for the whole fleet here: no per-token byte budget.
        self.env = {**os.environ, "NUMPARITY_DATABASE_URL": database_url,
                    "NUMPARITY_MIGRATE_ON_START": "false", "NUMPARITY_TOKEN_BYTES_PER_S": "0"}
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [*server_command(), "serve", "--host", "127.0.0.1", "--port", str(self.port),
                 "--workers", "1", "--log-level", "warning"],
                env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait(self, path: str = "/readyz", timeout: float = 60) -> None:
        """Until ``path`` answers 200 (``/healthz``: the process listens)."""
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server on port {self.port} exited with "
                                   f"{self.process.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.base_url + path, timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"server on port {self.port} not answering {path}:\n{self.log()}")

    def kill(self) -> None:
        """SIGKILL: no graceful shutdown, requests in flight are cut."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=15)

    def stop(self) -> None:
        if not self.process or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=15)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""


# -- the run documents -----------------------------------------------------------------------

def template_document() -> dict[str, Any]:
    """``bench/ingest.py``'s document (the agent's environment capture, knobs, fingerprints)
    cut to the workloads and variants ``make demo`` runs: 4 results, 40 tensors."""
    from ingest import suite_document  # torch: only the parent needs it

    document = suite_document("template")
    document["results"] = [r for r in document["results"]
                           if r["workload"] in TEMPLATE_WORKLOADS
                           and r["variant"] in TEMPLATE_VARIANTS]
    return document


def run_document(template: dict[str, Any], node: str, *, new_environment: bool
                 ) -> dict[str, Any]:
    """The template as a new run of `node`, now; on a new environment every hash is new
    (the server does not recompute them), so every fingerprint travels."""
    now = utc_now()
    document = {**template, "run_id": str(uuid.uuid4()),
                "node": {"name": node, "labels": {"fleet": "faults"}},
                "started_at": now, "finished_at": now}
    if new_environment:
        renamed: dict[str, str] = {}
        environment = {**template["environment"], "bench_environment": secrets.token_hex(16)}
        document["environment"] = {**environment, "env_key": compute_env_key(environment)}
        document["results"] = [
            {**result, "tensors": [
                {**tensor, "hash": renamed.setdefault(tensor["hash"], secrets.token_hex(32))}
                for tensor in result["tensors"]]}
            for result in template["results"]]
    return document


# -- the agents (this file run as a script) -----------------------------------------------------

def _agent(index: int, config: dict[str, Any], template: dict[str, Any],
           record: dict[str, Any], verify: Any) -> None:
    rng = random.Random(config["seed"] * 100_003 + index)
    spool = Path(config["spool_root"]) / f"agent-{index:03d}"
    node = f"fleet-{index:03d}"
    servers: list[str] = config["servers"]
    start_at: float = config["start_at"]
    end = start_at + config["duration"]
    sent: list[list[Any]] = record["sent"]
    requests: list[list[Any]] = record["requests"]
    backoff = {"streak": 0, "not_before": 0.0}

    def upload_spooled(phase: str) -> None:
        """Send what is spooled, oldest first, each to either server; after a failure worth
        retrying, stop and wait (1, 2, 4 ... 30 s, half to all of it, at least the
        server's Retry-After) before the next attempt, as the agent's flush backs off."""
        if time.time() < backoff["not_before"]:
            return
        for path in spooled(spool):
            server = rng.randrange(len(servers))
            began = time.time()
            clock = time.perf_counter()
            outcome = send_spooled(path, server=servers[server], token=config["token"],
                                   timeout=config["timeout"], log_line=lambda _line: None,
                                   verify=verify)
            cause = getattr(outcome, "cause", "")
            requests.append([round(began - start_at, 3),
                             round(time.perf_counter() - clock, 4),
                             outcome.status, server, phase, cause])
            if outcome.ok:
                backoff["streak"] = 0
            elif (outcome.retry or outcome.status in (401, 403)) and cause != "quarantined":
                backoff["streak"] += 1
                step = min(BACKOFF_CAP_S, 2.0 ** (backoff["streak"] - 1))
                delay = max(step / 2 + rng.uniform(0, step / 2),
                            getattr(outcome, "retry_after", None) or 0.0)
                backoff["not_before"] = time.time() + delay
                return

    low, high = config["interval"]
    _sleep_until(start_at + rng.uniform(0, high))
    while time.time() < end:
        new_environment = rng.random() < config["new_environment_share"]
        document = run_document(template, node, new_environment=new_environment)
        spool_document(document, spool)
        sent.append([document["run_id"], new_environment])
        upload_spooled("load")
        _sleep_until(min(end, time.time() + rng.uniform(low, high)))
    while spooled(spool) and time.time() < config["flush_deadline"]:
        _sleep_until(min(backoff["not_before"], config["flush_deadline"]))
        upload_spooled("flush")


def _sleep_until(moment: float) -> None:
    delay = moment - time.time()
    if delay > 0:
        time.sleep(delay)


def shared_tls_context() -> Any:
    """One TLS context for every upload of this process (``verify=`` of the agent's
    upload functions).

    The agent makes an httpx client per spooled document it sends, and httpx loads the CA
    bundle into a new TLS context for each (~20 ms of CPU, even for plain http). A node
    pays that once per run; fifty simulated nodes on two shared cores would pay it fifty
    times over, so the simulation hands every upload the same context (the requests are
    unchanged)."""
    return httpx.create_ssl_context()


def agent_process(config_path: Path, out_path: Path) -> None:
    """Run this process's agents as threads; write what each sent and every upload."""
    config = json.loads(config_path.read_text())
    verify = shared_tls_context() if config.get("share_tls_context", True) else True
    template = json.loads(Path(config["template"]).read_text())
    records = {index: {"index": index, "sent": [], "requests": [], "errors": []}
               for index in config["agents"]}

    def run(index: int) -> None:
        try:
            _agent(index, config, template, records[index], verify)
        except Exception as exc:  # counted: the scenario fails on any
            records[index]["errors"].append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=run, args=(i,), name=f"agent-{i}")
               for i in config["agents"]]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        tmp = out_path.with_name(out_path.name + ".tmp")
        tmp.write_text(json.dumps({"agents": list(records.values()),
                                   "cpu_s": usage.ru_utime + usage.ru_stime}))
        os.replace(tmp, out_path)


# -- the scenario ----------------------------------------------------------------------------

@dataclass
class Scenario:
    agents: int = 50
    duration: float = 60.0
    db_outage_at: float = 24.0        # seconds into the load
    db_outage: float = 10.0
    kill_at: float = 36.0
    restart_after: float = 5.0
    interval: tuple[float, float] = (1.0, 2.0)  # seconds between an agent's runs
    new_environment_share: float = 0.02
    agents_per_process: int = 10
    share_tls_context: bool = True    # see shared_tls_context()
    flush_timeout: float = 180.0      # after the load, to empty every spool
    timeout: float = 30.0             # the agent's upload timeout
    seed: int = 7

    def check(self) -> None:
        if self.agents < 1 or self.duration <= 0:
            raise ValueError("needs at least one agent and a positive duration")
        if self.db_outage > 0 and self.db_outage_at + self.db_outage >= self.duration:
            raise ValueError("the database outage must end before the load does")
        if self.kill_at >= 0 and self.kill_at + self.restart_after >= self.duration:
            raise ValueError("the killed server must be restarted before the load ends")


@dataclass
class Fault:
    what: str
    began: float             # seconds since the load started
    ended: float = math.nan  # the database accepting connections / the server answering
    detail: str = ""


@dataclass
class Report:
    scenario: Scenario
    postgres_version: str
    cpus: int
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]
    faults: list[Fault]
    killed_pid: int | None
    restarted_pid: int | None
    sent: int
    sent_new_environment: int
    stored: int
    still_spooled: int
    lost: int
    duplicated: int
    incomplete: int
    set_aside: dict[str, list[str]]         # spool subfolder -> file names
    agent_errors: list[str]
    requests: list[list[Any]]               # [t, latency, status, server, phase, cause]
    flush_seconds: float                    # after the load, until every spool was empty
    client_cpu_s: float
    rows: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    # -- derived figures --
    def outcomes(self, requests: list[list[Any]] | None = None) -> Counter[str]:
        kinds: Counter[str] = Counter()
        for request in self.requests if requests is None else requests:
            kinds[_kind(request)] += 1
        return kinds

    def window(self, fault: Fault) -> list[list[Any]]:
        """The uploads that were under way at some moment of the fault."""
        end = fault.ended if not math.isnan(fault.ended) else fault.began
        return [r for r in self.requests if r[0] <= end and r[0] + r[1] >= fault.began]

    def latencies(self, *, outside_faults: bool = False) -> list[float]:
        chosen = [r for r in self.requests if _kind(r) in ("created", "replayed")]
        if outside_faults:
            during = {id(r) for f in self.faults for r in self.window(f)}
            chosen = [r for r in chosen if id(r) not in during]
        return sorted(r[1] for r in chosen)

    def served_after_restart(self) -> int:
        """Uploads the restarted server stored after it answered again."""
        restart = next((f for f in self.faults if f.what == "server killed"), None)
        if restart is None or math.isnan(restart.ended):
            return 0
        return sum(1 for r in self.requests
                   if r[3] == 0 and r[0] >= restart.ended and _kind(r) in ("created",
                                                                          "replayed"))

    def problems(self) -> list[str]:
        found = []
        if self.lost:
            found.append(f"{self.lost} run(s) lost")
        if self.duplicated:
            found.append(f"{self.duplicated} run(s) duplicated")
        if self.incomplete:
            found.append(f"{self.incomplete} run(s) stored without all their results")
        for folder, names in self.set_aside.items():
            found.append(f"{len(names)} document(s) in {folder}/: {', '.join(names[:5])}")
        if self.still_spooled:
            found.append(f"{self.still_spooled} run(s) still spooled after "
                         f"{self.scenario.flush_timeout:.0f} s of flushing")
        found += [f"agent error: {e}" for e in self.agent_errors[:10]]
        return found

    def lines(self) -> list[str]:
        s = self.scenario
        out = [f"fleet: {s.agents} agents for {s.duration:.0f} s (a run every "
               f"{s.interval[0]:g}-{s.interval[1]:g} s each, {s.new_environment_share:.0%} on "
               f"a new environment), 2 server processes, PostgreSQL {self.postgres_version} "
               f"of its own; {self.cpus} CPUs, load average {_load(self.load_before)} before"]
        out.append("faults:")
        for fault in self.faults:
            out.append(f"  {fault.what:<18} at {fault.began:5.1f} s, back at {fault.ended:5.1f} s "
                       f"({fault.ended - fault.began:.1f} s){fault.detail}")
        kinds = self.outcomes()
        total = sum(kinds.values()) or 1
        out.append(f"runs:     sent {self.sent} ({self.sent_new_environment} on a new "
                   f"environment), stored {self.stored}, still spooled {self.still_spooled}, "
                   f"lost {self.lost}, duplicated {self.duplicated}, incomplete "
                   f"{self.incomplete}, rejected or quarantined "
                   f"{sum(len(v) for v in self.set_aside.values())}")
        out.append(f"uploads:  {total} attempts: {kinds['created']} created (201), "
                   f"{kinds['replayed']} replayed (200); errors: " + ", ".join(
                       f"{kind} {kinds[kind]} ({kinds[kind] / total:.1%})"
                       for kind in KINDS if kind in ("unreachable", "503", "other 5xx",
                                                     "4xx") or kinds[kind]))
        for fault in self.faults:
            window = self.window(fault)
            k = self.outcomes(window)
            failed = len(window) - k["created"] - k["replayed"]
            out.append(f"  during {fault.what:<18} {len(window):5d} attempts, {failed} failed "
                       f"({_kinds(k)})")
        in_faults = {id(r) for f in self.faults for r in self.window(f)}
        rest = [r for r in self.requests if id(r) not in in_faults]
        k = self.outcomes(rest)
        out.append(f"  elsewhere {'':<16} {len(rest):5d} attempts, "
                   f"{len(rest) - k['created'] - k['replayed']} failed ({_kinds(k)})")
        lat = self.latencies()
        calm = self.latencies(outside_faults=True)
        out.append(f"latency:  successful uploads (as the agent sees them: read the spool, "
                   f"ask, send) p50 {_ms(_quantile(lat, 0.5))}, p99 {_ms(_quantile(lat, 0.99))}, "
                   f"max {_ms(lat[-1] if lat else math.nan)}; outside the faults p99 "
                   f"{_ms(_quantile(calm, 0.99))}")
        load_ok = sum(1 for r in self.requests if r[4] == "load" and _kind(r) in
                      ("created", "replayed"))
        out.append(f"rate:     {self.sent / s.duration:.1f} runs/s sent, "
                   f"{load_ok / s.duration:.1f} stored/s during the load; after it, "
                   f"{self.flush_seconds:.1f} s to empty every spool; the restarted server "
                   f"stored {self.served_after_restart()} after it came back")
        per_run = self.client_cpu_s / max(self.sent, 1) * 1000
        out.append(f"client:   {math.ceil(s.agents / s.agents_per_process)} agent processes, "
                   f"{self.client_cpu_s:.1f} s CPU ({per_run:.0f} ms a run); load average "
                   f"{_load(self.load_after)} after")
        problems = self.problems()
        out.append("result:   " + ("OK: nothing lost, nothing duplicated" if not problems
                                   else "FAILED: " + "; ".join(problems)))
        return out

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("requests")
        data["outcomes"] = dict(self.outcomes())
        return data


KINDS = ("unreachable", "503", "other 5xx", "4xx", "quarantined", "tls")


def _kind(request: list[Any]) -> str:
    """What one upload (``[t, latency, status, server, phase, cause]``) came to."""
    status, cause = request[2], request[5]
    if status is None:
        return cause if cause in ("quarantined", "tls") else "unreachable"
    if status == 201:
        return "created"
    if 200 <= status < 300:
        return "replayed"
    if status == 503:
        return "503"
    if status >= 500:
        return "other 5xx"
    return "4xx"


def _kinds(kinds: Counter[str]) -> str:
    parts = [f"{kind} {kinds[kind]}" for kind in KINDS if kinds[kind]]
    return ", ".join(parts) or "none"


def _quantile(values: list[float], q: float) -> float:
    """Nearest rank of the sorted `values`."""
    if not values:
        return math.nan
    return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]


def _ms(seconds: float) -> str:
    return "n/a" if math.isnan(seconds) else f"{seconds * 1000:.0f} ms"


def _load(avg: tuple[float, float, float]) -> str:
    return " ".join(f"{x:.2f}" for x in avg)


def run_scenario(scenario: Scenario, workdir: Path,
                 say: Callable[[str], None] = lambda _line: None) -> Report:
    """Run the whole scenario in `workdir` (spools, logs); its PostgreSQL instance and its
    processes are gone when this returns or raises."""
    scenario.check()
    load_before = os.getloadavg()
    postgres = PostgresInstance()
    servers: list[ServerProcess] = []
    agents: list[subprocess.Popen[bytes]] = []
    try:
        say(f"PostgreSQL from {postgres.bin} in {postgres.root}, port {postgres.port}")
        postgres.init()
        server_cli(postgres.url, "migrate")
        token = server_cli(postgres.url, "token", "create", "--role", "agent",
                           "--label", "fleet").strip()
        template = workdir / "template.json"
        template.write_text(json.dumps(template_document(), separators=(",", ":")))
        servers = [ServerProcess(postgres.url, workdir / f"server-{i}.log") for i in range(2)]
        for server in servers:
            server.start()
        for server in servers:
            server.wait()
        say(f"servers on {', '.join(s.base_url for s in servers)} (pids "
            f"{', '.join(str(s.pid) for s in servers)})")

        spool_root = workdir / "spools"
        start_at = time.time() + 1.0
        flush_deadline = start_at + scenario.duration + scenario.flush_timeout
        indices = list(range(scenario.agents))
        groups = [indices[i:i + scenario.agents_per_process]
                  for i in range(0, len(indices), scenario.agents_per_process)]
        outputs = []
        for number, group in enumerate(groups):
            config = {"servers": [s.base_url for s in servers], "token": token,
                      "template": str(template), "spool_root": str(spool_root),
                      "agents": group, "start_at": start_at, "duration": scenario.duration,
                      "flush_deadline": flush_deadline, "interval": list(scenario.interval),
                      "new_environment_share": scenario.new_environment_share,
                      "timeout": scenario.timeout, "seed": scenario.seed,
                      "share_tls_context": scenario.share_tls_context}
            config_path = workdir / f"agents-{number}.json"
            config_path.write_text(json.dumps(config))
            outputs.append(workdir / f"agents-{number}.out.json")
            with (workdir / f"agents-{number}.log").open("wb") as log:
                agents.append(subprocess.Popen(
                    [sys.executable, str(Path(__file__).resolve()), "agents",
                     str(config_path), str(outputs[-1])],
                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        say(f"{scenario.agents} agents in {len(agents)} processes, starting")

        faults, killed_pid, restarted_pid = _inject_faults(scenario, start_at, postgres,
                                                           servers[0], say)
        say("load over; flushing every spool" if time.time() >= start_at + scenario.duration
            else "faults done")
        for process in agents:
            remaining = flush_deadline + 60 - time.time()
            try:
                process.wait(timeout=max(remaining, 1))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        flushed_at = time.time()

        records: list[dict[str, Any]] = []
        agent_errors: list[str] = []
        client_cpu = 0.0
        for number, out in enumerate(outputs):
            if not out.exists():
                log = (workdir / f"agents-{number}.log").read_text(errors="replace")[-2000:]
                agent_errors.append(f"agent process {number} left no record "
                                    f"(exit {agents[number].returncode}): {log}")
                continue
            data = json.loads(out.read_text())
            client_cpu += data["cpu_s"]
            records += data["agents"]
        for record in records:
            agent_errors += [f"agent {record['index']}: {e}" for e in record["errors"]]

        report = _count(scenario, postgres, spool_root, records, agent_errors)
        last = max((r[0] + r[1] for rec in records for r in rec["requests"]), default=0.0)
        report.flush_seconds = max(0.0, min(last, flushed_at - start_at) - scenario.duration)
        report.faults = faults
        report.killed_pid, report.restarted_pid = killed_pid, restarted_pid
        report.client_cpu_s = client_cpu
        report.load_before = load_before
        report.load_after = os.getloadavg()
        report.extra["postgres_root"] = str(postgres.root)
        return report
    finally:
        for process in agents:
            if process.poll() is None:
                process.kill()
                process.wait()
        for server in servers:
            server.stop()
        postgres.close()


def _inject_faults(scenario: Scenario, start_at: float, postgres: PostgresInstance,
                   victim: ServerProcess, say: Callable[[str], None]
                   ) -> tuple[list[Fault], int | None, int | None]:
    """The faults on the load's clock, in order; returns when the last one has healed."""
    faults: list[Fault] = []
    killed_pid = restarted_pid = None
    events: list[tuple[float, str]] = []
    if scenario.db_outage > 0:
        events += [(scenario.db_outage_at, "db stop"),
                   (scenario.db_outage_at + scenario.db_outage, "db start")]
    if scenario.kill_at >= 0:
        events += [(scenario.kill_at, "kill"), (scenario.kill_at + scenario.restart_after,
                                                "restart")]
    ready_waiter: threading.Thread | None = None
    for at, event in sorted(events):
        _sleep_until(start_at + at)
        now = time.time() - start_at
        if event == "db stop":
            faults.append(Fault("database stopped", now))
            postgres.stop("fast")
            say(f"{now:5.1f} s  database stopped")
        elif event == "db start":
            postgres.start()
            fault = next(f for f in faults if f.what == "database stopped")
            fault.ended = time.time() - start_at
            say(f"{fault.ended:5.1f} s  database started")
        elif event == "kill":
            killed_pid = victim.pid
            victim.kill()
            faults.append(Fault("server killed", now, detail=f"; pid {killed_pid}"))
            say(f"{now:5.1f} s  server {victim.base_url} killed (pid {killed_pid})")
        else:
            victim.start()
            restarted_pid = victim.pid
            fault = next(f for f in faults if f.what == "server killed")
            fault.detail += f" restarted at {now:.1f} s as pid {restarted_pid}"

            def wait_ready(fault: Fault = fault) -> None:
                victim.wait("/healthz")
                fault.ended = time.time() - start_at
                say(f"{fault.ended:5.1f} s  server {victim.base_url} answering again")

            ready_waiter = threading.Thread(target=wait_ready, daemon=True)
            ready_waiter.start()
    if ready_waiter is not None:
        ready_waiter.join(timeout=90)
    return faults, killed_pid, restarted_pid


def _count(scenario: Scenario, postgres: PostgresInstance, spool_root: Path,
           records: list[dict[str, Any]], agent_errors: list[str]) -> Report:
    import psycopg

    sent = {run_id: new for record in records for run_id, new in record["sent"]}
    sent_rows = sum(len(record["sent"]) for record in records)
    with psycopg.connect(postgres.dsn) as connection:
        rows = connection.execute(
            "SELECT r.run_id, count(res.id) FROM runs r "
            "LEFT JOIN results res ON res.run_pk = r.id GROUP BY r.id, r.run_id").fetchall()
    expected_results = len(json.loads(Path(spool_root.parent / "template.json").read_text())
                           ["results"])
    stored_ids = Counter(run_id for run_id, _results in rows)
    still: set[str] = set()
    set_aside: dict[str, list[str]] = {}
    if spool_root.is_dir():
        for spool in sorted(spool_root.iterdir()):
            for path in spooled(spool):
                still.add(path.stem.split("-", 1)[1] if "-" in path.stem else path.stem)
            for folder in (p for p in spool.iterdir() if p.is_dir()):
                names = [f"{spool.name}/{p.name}" for p in folder.iterdir() if p.is_file()]
                if names:
                    set_aside.setdefault(folder.name, []).extend(names)
    stored_of_sent = sum(1 for run_id in sent if run_id in stored_ids)
    lost = sum(1 for run_id in sent if run_id not in stored_ids and run_id not in still)
    duplicated = (sum(n - 1 for n in stored_ids.values())
                  + sum(1 for run_id in stored_ids if run_id not in sent)
                  + (sent_rows - len(sent)))
    incomplete = sum(1 for _run_id, results in rows if results != expected_results)
    requests = sorted((r for record in records for r in record["requests"]),
                      key=lambda r: r[0])
    return Report(
        scenario=scenario, postgres_version=postgres.version, cpus=os.cpu_count() or 1,
        load_before=(0.0, 0.0, 0.0), load_after=(0.0, 0.0, 0.0), faults=[],
        killed_pid=None, restarted_pid=None, sent=len(sent),
        sent_new_environment=sum(1 for new in sent.values() if new), stored=stored_of_sent,
        still_spooled=len(still), lost=lost, duplicated=duplicated, incomplete=incomplete,
        set_aside=set_aside, agent_errors=agent_errors, requests=requests,
        flush_seconds=0.0, client_cpu_s=0.0, rows=len(rows))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "agents":
        agent_process(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        sys.exit("usage: _faults.py agents CONFIG OUT (started by bench/fleet.py)")
