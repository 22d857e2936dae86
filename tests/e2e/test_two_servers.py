"""docker-compose.yml's topology without Docker: two server processes on two loopback
ports sharing one PostgreSQL, migrated once by the CLI, with real agents against both.

- Agents upload to both replicas at the same time; every run is visible through both,
  and both answer the same.
- A replica killed with SIGKILL: the agent pointed at it keeps its run in the spool
  (exit 3); `numparity-agent flush` against the other replica uploads it, and the same
  document sent again to the restarted replica is stored once (200, idempotent run_id).
- With nginx installed, deploy/nginx.conf itself in front of the replicas: an upload sent
  to a replica that dies before it answers is resent to the other (POST /api/v1/runs is
  idempotent); the sign-in form, which is not, is not resent.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import nginx as nginx_helpers
from helpers.processes import free_port, run_cli, start_server, stop_process, wait_ready

from numparity_agent.testing import spooled

pytestmark = [
    pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two cores"),
    # PostgreSQL only (several processes on one SQLite file are refused by design);
    # without NUMPARITY_TEST_DATABASE_URL the fixture skips and says so.
    pytest.mark.parametrize("database_url", ["postgresql"], indirect=True),
]

PROBES = ("--workloads", "probes", "--variants", "default", "--repeats", "1")


@dataclass
class Replica:
    name: str
    base_url: str
    process: subprocess.Popen = field(repr=False)
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@dataclass
class Lab:
    """One migrated PostgreSQL database, its tokens, and the replicas started on it."""

    database_url: str
    agent_token: str
    reader_token: str
    workdir: Path
    replicas: list[Replica] = field(default_factory=list)

    def start(self, name: str) -> Replica:
        """`numparity-server serve` on a free loopback port (not yet ready)."""
        log_path = self.workdir / f"{name}-{len(self.replicas)}.log"
        env = {**os.environ, "NUMPARITY_DATABASE_URL": self.database_url,
               "NUMPARITY_MIGRATE_ON_START": "false"}
        process, base_url = start_server(log_path, env, "--log-level", "info")
        replica = Replica(name, base_url, process, log_path)
        self.replicas.append(replica)
        return replica

    def ready(self, *replicas: Replica) -> None:
        for replica in replicas:
            wait_ready(replica.base_url, replica.process, replica.log_path)

    def get(self, base_url: str, path: str, **params: Any) -> Any:
        response = httpx.get(f"{base_url}{path}", params=params, timeout=60,
                             headers={"Authorization": f"Bearer {self.reader_token}"})
        assert response.status_code == 200, f"{base_url}{path}: {response.text}"
        return response.json()

    def ingested(self, replica: Replica) -> dict[str, float]:
        """The replica's answers to POST /api/v1/runs since it started, by outcome
        (`numparity_runs_ingested_total`: created is a 201, replayed a 200)."""
        response = httpx.get(f"{replica.base_url}/metrics", timeout=60,
                             headers={"Authorization": f"Bearer {self.reader_token}"})
        assert response.status_code == 200, response.text
        found = re.findall(r'^numparity_runs_ingested_total\{outcome="(\w+)"\} (\S+)$',
                           response.text, re.M)
        return {outcome: float(value) for outcome, value in found if float(value)}

    def agent(self, *args: str) -> subprocess.Popen:
        """`numparity-agent ARGS` with the agent token in NUMPARITY_TOKEN; an upload that
        fails is not retried within the same command (NUMPARITY_MAX_WAIT=0)."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("NUMPARITY_") or k == "NUMPARITY_TEST_DATABASE_URL"}
        return subprocess.Popen(
            [sys.executable, "-m", "numparity_agent", *args],
            env={**env, "NUMPARITY_TOKEN": self.agent_token, "NUMPARITY_MAX_WAIT": "0"},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip


def finish(process: subprocess.Popen, timeout: float = 300) -> tuple[int, str]:
    """Wait for an agent; its exit code and stderr."""
    try:
        _out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        _out, err = process.communicate()
        raise AssertionError(f"agent still running after {timeout}s:\n{err}") from None
    return process.returncode, err


@pytest.fixture
def lab(database_url: str, tmp_path: Path) -> Iterator[Lab]:
    # What the compose file's `migrate` service does, once, before any replica starts.
    run_cli("migrate", database_url=database_url)
    agent = run_cli("token", "create", "--role", "agent", "--label", "fleet",
                    database_url=database_url).stdout.strip()
    reader = run_cli("token", "create", "--role", "reader", "--label", "dashboards",
                     database_url=database_url).stdout.strip()
    lab = Lab(database_url, agent, reader, tmp_path)
    try:
        yield lab
    finally:
        for replica in lab.replicas:
            stop_process(replica.process)


def test_agents_against_two_replicas_of_one_database(lab: Lab, tmp_path: Path) -> None:
    a, b = lab.start("server-1"), lab.start("server-2")
    lab.ready(a, b)

    # Two nodes on each replica, all four at once. They run the same code on the same
    # machine, so they ask both replicas for the same fingerprints and upload them
    # concurrently: the shared database must store each once and accept every run.
    nodes = {"lab-a1": a, "lab-a2": a, "lab-b1": b, "lab-b2": b}
    agents = {
        node: lab.agent("run", *PROBES, "--server", replica.base_url, "--node", node,
                        "--spool", str(tmp_path / node), "--output", str(tmp_path / f"{node}.json"))
        for node, replica in nodes.items()
    }
    for node, process in agents.items():
        code, err = finish(process)
        assert code == 0, f"{node}:\n{err}\n{nodes[node].log()}"
        assert spooled(tmp_path / node) == []
    assert lab.ingested(a) == lab.ingested(b) == {"created": 2}
    run_ids = {node: json.loads((tmp_path / f"{node}.json").read_text())["run_id"]
               for node in nodes}

    def the_same_through_both(path: str, **params: Any) -> Any:
        first, second = lab.get(a.base_url, path, **params), lab.get(b.base_url, path, **params)
        assert first == second, f"{path} differs between the replicas"
        return first

    runs = the_same_through_both("/api/v1/runs", limit=500)
    assert runs["total"] == 4
    assert {run["run_id"]: run["node"] for run in runs["items"]} == {
        run_id: node for node, run_id in run_ids.items()}
    listed = the_same_through_both("/api/v1/nodes", limit=500)
    assert sorted(item["name"] for item in listed["items"]) == sorted(nodes)
    assert all(item["runs"] == 1 for item in listed["items"])
    report = the_same_through_both("/api/v1/divergence", workload="probes", variant="default",
                                   tensor="sum_long")
    assert sorted(n for group in report["groups"] for n in group["nodes"]) == sorted(nodes)
    for node, run_id in run_ids.items():
        assert the_same_through_both(f"/api/v1/runs/{run_id}")["node"] == node

    # One replica dies without a word (SIGKILL: no shutdown, its connections cut).
    b.process.send_signal(signal.SIGKILL)
    b.process.wait(timeout=15)
    spool = tmp_path / "lab-b1"
    code, err = finish(lab.agent("run", *PROBES, "--server", b.base_url, "--node", "lab-b1",
                                 "--spool", str(spool)))
    assert code == 3, f"an unreachable server keeps the run in the spool (exit 3):\n{err}"
    (kept,) = spooled(spool)
    stored_bytes = kept.read_bytes()
    document = json.loads(stored_bytes)
    assert document["node"]["name"] == "lab-b1"
    copy = tmp_path / "copy" / kept.name
    copy.parent.mkdir()
    shutil.copy(kept, copy)

    # Its agent sends it to the other replica.
    code, err = finish(lab.agent("flush", "--server", a.base_url, "--spool", str(spool)))
    assert code == 0, f"{err}\n{a.log()}"
    assert spooled(spool) == []
    assert lab.ingested(a) == {"created": 3}
    assert lab.get(a.base_url, f"/api/v1/runs/{document['run_id']}")["node"] == "lab-b1"

    # The replica comes back (compose restarts it) and is sent the same document again:
    # it answers 200 and stores nothing new.
    b = lab.start("server-2")
    lab.ready(b)
    code, err = finish(lab.agent("flush", "--server", b.base_url, "--spool",
                                 str(copy.parent)))
    assert code == 0, f"{err}\n{b.log()}"
    assert lab.ingested(b) == {"replayed": 1}, "the same document again: 200, not stored"
    full = httpx.post(f"{b.base_url}/api/v1/runs", content=stored_bytes, timeout=60,
                      headers={"Authorization": f"Bearer {lab.agent_token}",
                               "Content-Type": "application/json"})
    assert full.status_code == 200, full.text
    assert lab.ingested(b) == {"replayed": 2}
    runs = the_same_through_both("/api/v1/runs", limit=500)
    assert runs["total"] == 5
    assert [r["run_id"] for r in runs["items"]].count(document["run_id"]) == 1
    timeline = the_same_through_both("/api/v1/nodes/lab-b1")
    assert timeline["runs"]["total"] == 2
    for replica in (a, b):
        assert "Traceback" not in replica.log(), replica.log()


# -- deploy/nginx.conf in front of the replicas (when nginx is installed) -----------------


class DyingReplica:
    """A replica that reads each request whole, then closes the connection without an
    answer: a server that dies after the request was sent. Counts what it was sent."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])
        self.requests: list[str] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.sock.accept()
            except OSError:
                return
            with connection:
                connection.settimeout(5)
                data = b""
                try:
                    while b"\r\n\r\n" not in data:
                        chunk = connection.recv(65536)
                        if not chunk:
                            break
                        data += chunk
                    head, _, body = data.partition(b"\r\n\r\n")
                    length = 0
                    for line in head.split(b"\r\n")[1:]:
                        name, _, value = line.partition(b":")
                        if name.strip().lower() == b"content-length":
                            length = int(value)
                    while len(body) < length:
                        chunk = connection.recv(65536)
                        if not chunk:
                            break
                        body += chunk
                except OSError:
                    pass
                if data:
                    self.requests.append(data.split(b"\r\n", 1)[0].decode("latin-1"))

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def nginx() -> str:
    """The nginx binary; skips (before the database is set up) without one."""
    found = nginx_helpers.find_nginx()
    if found is None:
        pytest.skip("nginx is not installed (`apt-get install nginx`, or "
                    "NUMPARITY_NGINX=/path/to/nginx): the proxy is not run")
    return str(found)


def test_the_proxy_resends_uploads_to_the_other_replica(nginx: str, lab: Lab,
                                                         tmp_path: Path) -> None:
    server = lab.start("server-2")
    dying = DyingReplica()
    port = free_port()
    conf = nginx_helpers.render_for_loopback(
        tmp_path, listen_port=port,
        replicas={"server-1": dying.port, "server-2": int(server.base_url.rsplit(":", 1)[1])})
    # Keep the dying replica in the rotation, so that requests keep reaching it (the
    # shipped max_fails=1 would set it aside for 10 s after the first failure).
    text = conf.read_text()
    assert text.count("max_fails=1") == 2, text
    conf.write_text(text.replace("max_fails=1", "max_fails=0"))
    checked = nginx_helpers.check_config(nginx, conf)
    assert checked.returncode == 0, checked.stderr
    log_path = tmp_path / "nginx.log"
    with log_path.open("wb") as log:
        proxy = subprocess.Popen(nginx_helpers.nginx_command(nginx, conf), stdout=log,
                                 stderr=subprocess.STDOUT)
    proxy_url = f"http://127.0.0.1:{port}"
    try:
        lab.ready(server)
        wait_ready(proxy_url, proxy, log_path, timeout=30, path="/healthz", name="nginx")

        # A real agent through the proxy: ask-first, then the upload; whichever replica
        # nginx picks first, the run is stored.
        code, err = finish(lab.agent("run", *PROBES, "--server", proxy_url, "--node", "lab-p1",
                                     "--spool", str(tmp_path / "spool"),
                                     "--output", str(tmp_path / "lab-p1.json")))
        assert code == 0, f"{err}\n{log_path.read_text()}"
        document = json.loads((tmp_path / "lab-p1.json").read_text())

        # More uploads, each a new run, full documents: round robin sends every other one
        # to the dying replica first, which takes it and drops the connection. nginx
        # resends it to the live one (`non_idempotent` on /api/v1/runs): every one stored.
        agent = {"Authorization": f"Bearer {lab.agent_token}"}
        statuses = []
        for index in range(6):
            document["run_id"] = f"proxy-retry-{index}"
            response = httpx.post(f"{proxy_url}/api/v1/runs", json=document, headers=agent,
                                  timeout=60)
            statuses.append(response.status_code)
        assert statuses == [201] * 6, (statuses, log_path.read_text())
        resent = [line for line in dying.requests if line.startswith("POST /api/v1/runs ")]
        assert resent, f"no upload reached the dying replica: {dying.requests}"
        runs = lab.get(proxy_url, "/api/v1/runs", limit=500)  # Authorization passed on
        assert runs["total"] == 7

        # The sign-in form is a POST nginx must not resend once a replica had it. Posted
        # from the proxy's own origin, as a browser does: nginx passes Host with its port,
        # so the live replica signs in (303) rather than refusing a cross-site form.
        before = len(dying.requests)
        answers = [httpx.post(f"{proxy_url}/login", data={"token": lab.reader_token},
                              headers={"Origin": proxy_url}, timeout=60).status_code
                   for _ in range(4)]
        reached = [r for r in dying.requests[before:] if r.startswith("POST /login ")]
        assert reached and answers.count(502) == len(reached), (answers, dying.requests)
        assert answers.count(303) == len(answers) - len(reached), answers

        # A replica that is gone (connection refused): nginx goes to the other one.
        dying.close()
        code, err = finish(lab.agent("run", *PROBES, "--server", proxy_url, "--node", "lab-p2",
                                     "--spool", str(tmp_path / "spool-2")))
        assert code == 0, f"{err}\n{log_path.read_text()}"
        assert lab.get(proxy_url, "/api/v1/nodes/lab-p2")["runs"]["total"] == 1
    finally:
        dying.close()
        stop_process(proxy)
