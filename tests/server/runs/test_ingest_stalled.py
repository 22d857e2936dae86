"""Body first, database second, against a real uvicorn server: stalled uploads hold no
database connection, are dropped with 408 after NUMPARITY_BODY_TIMEOUT_S, and reads go on
meanwhile; an upload being validated does not stop /healthz."""

from __future__ import annotations

import json
import os
import select
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import psycopg
import pytest
from helpers.documents import run_document
from helpers.processes import run_cli, start_server, stop_process, wait_ready
from sqlalchemy import make_url

# More stalled uploads than the pool has connections (5 + 10).
STALLED = 16
BODY_TIMEOUT_S = 8


@dataclass
class Server:
    base_url: str
    database_url: str
    agent: str
    reader: str

    @property
    def address(self) -> tuple[str, int]:
        parts = urlsplit(self.base_url)
        return parts.hostname or "127.0.0.1", parts.port or 80


@pytest.fixture
def server(migrated_database_url: str, tmp_path: Path) -> Iterator[Server]:
    url = migrated_database_url
    tokens = {role: run_cli("token", "create", "--role", role, database_url=url).stdout.strip()
              for role in ("agent", "reader")}
    env = {**os.environ, "NUMPARITY_DATABASE_URL": url,
           "NUMPARITY_BODY_TIMEOUT_S": str(BODY_TIMEOUT_S)}
    process, base_url = start_server(tmp_path / "server.log", env, "--log-level", "warning")
    try:
        wait_ready(base_url, process, tmp_path / "server.log")
        yield Server(base_url, url, tokens["agent"], tokens["reader"])
    finally:
        stop_process(process)


def _request_head(server: Server, path: str, length: int) -> bytes:
    host, port = server.address
    return (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Authorization: Bearer {server.agent}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\nConnection: close\r\n\r\n").encode()


def _answer(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    sock.settimeout(120)
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


def _idle_in_transaction(database_url: str) -> int:
    url = make_url(database_url)
    libpq = url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(libpq, autocommit=True) as connection:
        row = connection.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s "
            "AND state LIKE 'idle in transaction%%'", (url.database,)).fetchone()
    return int(row[0]) if row else 0


def test_stalled_uploads_hold_no_connection_and_are_dropped_with_408(server):
    host, port = server.address
    stalled = []
    for path in ["/api/v1/runs"] * (STALLED - 2) + ["/api/v1/fingerprints/missing"] * 2:
        sock = socket.create_connection((host, port), timeout=30)
        sock.sendall(_request_head(server, path, 100_000) + b'{"schema": "numparity.run/v1"')
        stalled.append(sock)
    try:
        # Reads and readiness answer while every stalled upload waits for its body.
        with httpx.Client(base_url=server.base_url, timeout=60) as client:
            for _ in range(3):
                assert client.get("/readyz").status_code == 200
                runs = client.get("/api/v1/runs",
                                  headers={"Authorization": f"Bearer {server.reader}"})
                assert runs.status_code == 200, runs.text
            # A complete upload still goes through.
            upload = client.post("/api/v1/runs", json=run_document(),
                                 headers={"Authorization": f"Bearer {server.agent}"})
            assert upload.status_code == 201, upload.text
        if server.database_url.startswith("postgresql"):
            assert _idle_in_transaction(server.database_url) == 0
        answers = [_answer(sock) for sock in stalled]
    finally:
        for sock in stalled:
            sock.close()
    for answer in answers:
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408"), answer[:200]
        detail = json.loads(body)
        assert detail["error"] == "request_timeout"
        assert "NUMPARITY_BODY_TIMEOUT_S" in detail["detail"]


def test_healthz_answers_while_a_large_upload_is_validated(server):
    # Close to the largest document the limits allow: 1.9 million strings, one NUL at
    # the end (the string check walks all of them).
    strings = ",".join(['"x"'] * 1_900_000)
    document = json.dumps(run_document())[:-1] + f', "padding": [{strings}, "\\u0000"]}}'
    body = document.encode()
    host, port = server.address
    with socket.create_connection((host, port), timeout=30) as upload:
        upload.sendall(_request_head(server, "/api/v1/runs", len(body)) + body)
        health = httpx.get(f"{server.base_url}/healthz", timeout=120)
        assert health.status_code == 200
        # The upload is still being validated when /healthz has answered.
        readable, _, _ = select.select([upload], [], [], 0)
        assert not readable, "the upload was answered before /healthz"
        answer = _answer(upload)
    assert answer.startswith(b"HTTP/1.1 422"), answer[:300]
    assert b"NUL" in answer
