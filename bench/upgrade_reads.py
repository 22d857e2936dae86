"""Reads while the fleet upgrades: the error rate of the fleet-wide reads on replicas of one
PostgreSQL while writers move nodes to new environments.

Not run by CI (its shorter version is ``tests/e2e/test_replicas.py``, whose scenario,
``tests/helpers/replicas.py``, this runs for longer). On a temporary database of the
PostgreSQL server of ``--postgres-url`` (dropped afterwards) it migrates once, makes an
agent and a reader token, starts ``--replicas`` ``numparity-server serve`` processes
(the ``numparity-server`` next to ``--python``: point it at another checkout's
virtualenv to measure that code), seeds ``--nodes`` nodes, and for ``--seconds`` has
``--writers`` threads upload each node's upgrade (a new environment, and a new answer
one upload in three) to the replicas in turn while ``--readers`` threads ask
``/api/v1/divergence``, ``/api/v1/audit``, the fleet page and the workload page of every
replica, with ``NUMPARITY_READ_CACHE_SECONDS=0``.

    .venv/bin/python bench/upgrade_reads.py [--replicas 2] [--nodes 12] [--seconds 30]
        [--writers 2] [--readers 4] [--python PATH] [--postgres-url URL] [--json FILE]

Prints the reads by route and status, the read error rate, the uploads by status, and
after one more upload to the first replica whether every replica's next read counts it.
Exit code 1 when a read failed, an upload was not stored, or a replica missed it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

import httpx
from sqlalchemy import make_url

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from helpers.documents import audit_document  # noqa: E402 - the tests' scenario
from helpers.replicas import seed, upgrade_while_reading  # noqa: E402

from numparity_server.kit.net import free_port  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--nodes", type=int, default=12)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--writers", type=int, default=2)
    parser.add_argument("--readers", type=int, default=4)
    parser.add_argument("--python", default=sys.executable,
                        help="the interpreter whose numparity-server the replicas run")
    parser.add_argument("--postgres-url", default=os.environ.get(
        "NUMPARITY_TEST_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"))
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()

    import psycopg

    base = make_url(args.postgres_url)
    admin_dsn = base.set(drivername="postgresql").render_as_string(hide_password=False)
    name = f"numparity_bench_{uuid.uuid4().hex[:12]}"
    url = base.set(drivername="postgresql+psycopg", database=name).render_as_string(
        hide_password=False)
    server = str(Path(args.python).with_name("numparity-server"))
    env = {**os.environ, "NUMPARITY_DATABASE_URL": url, "NUMPARITY_READ_CACHE_SECONDS": "0",
           "NUMPARITY_MIGRATE_ON_START": "false", "PYTHONDONTWRITEBYTECODE": "1"}
    processes: list[subprocess.Popen[bytes]] = []
    workdir = Path(tempfile.mkdtemp(prefix="numparity-upgrade-reads-"))
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        subprocess.run([server, "migrate"], env=env, check=True, capture_output=True)
        tokens = {role: subprocess.run(
            [server, "token", "create", "--role", role, "--label", f"bench-{role}"], env=env,
            check=True, capture_output=True, text=True).stdout.strip()
            for role in ("agent", "reader")}
        urls = []
        for index in range(args.replicas):
            port = free_port()
            log = (workdir / f"replica-{index}.log").open("wb")
            processes.append(subprocess.Popen(
                [server, "serve", "--host", "127.0.0.1", "--port", str(port),
                 "--log-level", "warning"], env=env, stdout=log, stderr=subprocess.STDOUT))
            urls.append(f"http://127.0.0.1:{port}")
        for replica in urls:
            _wait_ready(replica)
        agent = {"Authorization": f"Bearer {tokens['agent']}"}
        reader = {"Authorization": f"Bearer {tokens['reader']}"}
        seed(urls, agent, args.nodes)
        started = time.monotonic()
        load = upgrade_while_reading(urls, agent, reader, nodes=args.nodes,
                                     seconds=args.seconds, writers=args.writers,
                                     readers=args.readers, max_uploads=100_000)
        elapsed = time.monotonic() - started
        missed = _missed_by(urls, agent, reader, args.nodes + 1)
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
        with psycopg.connect(admin_dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    reads = sum(load.reads.values())
    by_route: dict[str, dict[str, int]] = {}
    for (route, status), count in sorted(load.reads.items()):
        by_route.setdefault(route, {})[str(status)] = count
    figures = {
        "replicas": args.replicas, "nodes": args.nodes, "seconds": round(elapsed, 1),
        "reads": reads, "failed_reads": load.failed_reads(),
        "read_error_rate": round(load.read_error_rate(), 4), "reads_by_route": by_route,
        "uploads": {str(k): v for k, v in load.uploads.items()},
        "replicas_missing_the_last_upload": missed,
        "first_failures": load.failures[:5],
    }
    print(json.dumps(figures, indent=2))
    print(f"server logs: {workdir}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    stored_all = set(load.uploads) <= {201}
    return 0 if load.failed_reads() == 0 and stored_all and not missed else 1


def _wait_ready(url: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} not ready after {timeout} s")


def _missed_by(urls: list[str], agent: dict[str, str], reader: dict[str, str],
               nodes: int) -> list[str]:
    """One more node through the first replica: the replicas whose next read does not
    count it."""
    with httpx.Client(timeout=60) as client:
        response = client.post(f"{urls[0]}/api/v1/runs", json=audit_document("node-last", 1),
                               headers=agent)
        response.raise_for_status()
        counted = Counter({url: client.get(f"{url}/api/v1/audit", headers=reader)
                           .json()["summary"]["nodes"] for url in urls})
    return [url for url in urls if counted[url] != nodes]


if __name__ == "__main__":
    raise SystemExit(main())
