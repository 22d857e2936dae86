"""Concurrent uploads against a real server, and `serve --workers 2` on PostgreSQL."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.documents import run_document
from helpers.processes import (
    run_cli,
    start_server,
    stop_process,
    wait_ready,
)


def create_token(role: str, database_url: str) -> str:
    return run_cli("token", "create", "--role", role, database_url=database_url).stdout.strip()


def _post_together(base_url: str, headers: dict[str, str], documents: list[dict[str, Any]]
                   ) -> list[int]:
    """Each document from its own client, released at the same moment."""
    barrier = threading.Barrier(len(documents))

    def upload(document: dict[str, Any]) -> int:
        with httpx.Client(base_url=base_url, headers=headers, timeout=60) as client:
            barrier.wait()
            return client.post("/api/v1/runs", json=document).status_code

    with ThreadPoolExecutor(len(documents)) as pool:
        return list(pool.map(upload, documents))


def _stored_runs(server: Any) -> list[dict[str, Any]]:
    page = httpx.get(f"{server.base_url}/api/v1/runs", headers=server.headers("reader"),
                     timeout=30).json()
    return list(page["items"])


def test_the_same_run_from_two_clients_is_stored_once(live_server):
    document = run_document("node-1")
    for _ in range(3):  # a few rounds: the race is not hit on every try
        statuses = _post_together(live_server.base_url, live_server.headers("agent"),
                                  [document, document])
        assert sorted(statuses) in ([200, 200], [200, 201]), live_server.log()
        document = run_document("node-1")
    statuses = _post_together(live_server.base_url, live_server.headers("agent"), [document] * 8)
    assert sorted(statuses) == [200] * 7 + [201], live_server.log()
    runs = _stored_runs(live_server)
    assert len(runs) == 4 and len({r["run_id"] for r in runs}) == 4
    assert "Traceback" not in live_server.log()


def test_two_documents_under_one_run_id_store_one(live_server):
    first = run_document("node-1", run_id="shared-id")
    second = run_document("node-1", run_id="shared-id", shift=1e-3)
    statuses = _post_together(live_server.base_url, live_server.headers("agent"),
                              [first, second])
    assert sorted(statuses) == [201, 409], live_server.log()
    assert [r["run_id"] for r in _stored_runs(live_server)] == ["shared-id"]


@pytest.fixture
def two_workers(migrated_database_url: str, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    if not migrated_database_url.startswith("postgresql"):
        pytest.skip("several workers need PostgreSQL (SQLite refuses: test_cli)")
    log_path = tmp_path / "server.log"
    env = {**os.environ, "NUMPARITY_DATABASE_URL": migrated_database_url}
    process, base_url = start_server(log_path, env, "--workers", "2", "--log-level", "info")
    try:
        wait_ready(base_url, process, log_path)
        yield base_url, log_path
    finally:
        stop_process(process, timeout=20)


def test_two_workers_on_postgresql_serve_uploads(two_workers, migrated_database_url):
    base_url, log_path = two_workers
    agent = create_token("agent", migrated_database_url)
    reader = create_token("reader", migrated_database_url)
    documents = [run_document(f"node-{i}", shift=1e-3 * (i % 2)) for i in range(12)]
    statuses = _post_together(base_url, {"Authorization": f"Bearer {agent}"},
                              documents)
    assert statuses == [201] * 12, log_path.read_text()
    page = httpx.get(f"{base_url}/api/v1/nodes", timeout=30,
                     headers={"Authorization": f"Bearer {reader}"}).json()
    assert page["total"] == 12
    log = log_path.read_text()
    assert log.count("Started server process") == 2, log
