"""Replicas on one PostgreSQL while the fleet upgrades (design §3.2, "Reads follow
writes"): two `numparity-server serve` processes that both migrate an empty database on
start, writers moving nodes to new environments through both, readers asking every
fleet-wide read of both.

- Both replicas come up (the second migration waits for the first, then finds the schema
  current).
- No read answers anything but 2xx: each read sees one snapshot of the fleet, whatever
  commits while it runs (36-39 % of these reads answered 500 before).
- Every upload is stored exactly once: none lost, none twice.
- After an upload's 201 on one replica, the other's next read shows it (the read cache
  keys on a counter the upload's own transaction advances).
"""

from __future__ import annotations

import os
from collections import Counter

import httpx
import pytest
from helpers.documents import audit_document
from helpers.processes import start_server, stop_process, wait_ready
from helpers.replicas import READS, seed, upgrade_while_reading
from sqlalchemy import create_engine, select

from numparity_server.auth.service import create_token
from numparity_server.kit.db import get_engine, session_factory
from numparity_server.kit.settings import Settings
from numparity_server.models import Run

pytestmark = [
    pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two cores"),
    # PostgreSQL only (several processes on one SQLite file are refused by design).
    pytest.mark.parametrize("database_url", ["postgresql"], indirect=True),
]

NODES = 6
SECONDS = 8.0


def test_two_replicas_answer_every_read_while_the_fleet_upgrades(database_url, tmp_path):
    env = {**os.environ, "NUMPARITY_DATABASE_URL": database_url,
           "NUMPARITY_MIGRATE_ON_START": "true", "NUMPARITY_READ_CACHE_SECONDS": "0"}
    started = [start_server(tmp_path / f"replica-{k}.log", env, "--log-level", "warning")
               for k in range(2)]
    try:
        for k, (process, url) in enumerate(started):
            wait_ready(url, process, tmp_path / f"replica-{k}.log", timeout=120)
        urls = [url for _process, url in started]
        with session_factory(get_engine(Settings(database_url=database_url)))() as session:
            agent = create_token(session=session, role="agent", label="writers").token
            reader = create_token(session=session, role="reader", label="readers").token
        agent_headers = {"Authorization": f"Bearer {agent}"}
        reader_headers = {"Authorization": f"Bearer {reader}"}
        seeded = seed(urls, agent_headers, NODES)

        load = upgrade_while_reading(urls, agent_headers, reader_headers, nodes=NODES,
                                     seconds=SECONDS)

        every_route = Counter(route for route, _status in load.reads)
        assert set(every_route) == set(READS), every_route
        assert load.failed_reads() == 0, (load.reads, load.failures[:5])
        assert load.uploads == Counter({201: len(load.stored)}), load.failures[:5]
        assert len(load.stored) >= 4, "the writers uploaded too little to race the readers"

        # One more node through replica 0: replica 1's next read counts it.
        with httpx.Client(timeout=60) as client:
            last = audit_document("node-last", 1)
            response = client.post(f"{urls[0]}/api/v1/runs", json=last, headers=agent_headers)
            assert response.status_code == 201, response.text
            for url in reversed(urls):
                audit = client.get(f"{url}/api/v1/audit", headers=reader_headers)
                assert audit.status_code == 200, audit.text
                assert audit.json()["summary"]["nodes"] == NODES + 1, url

        engine = create_engine(database_url)
        try:
            with engine.connect() as connection:
                stored = connection.scalars(select(Run.run_id)).all()
        finally:
            engine.dispose()
        posted = [*seeded, *load.stored, last["run_id"]]
        assert Counter(stored) == Counter(posted)  # none lost, none twice
    finally:
        for process, _url in started:
            stop_process(process)
    logs = "".join((tmp_path / f"replica-{k}.log").read_text(errors="replace")
                   for k in range(2))
    assert "Traceback" not in logs, logs[-5000:]
