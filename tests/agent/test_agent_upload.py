"""Spool and upload against a real local HTTP server and a closed port (design §2.6)."""

import gzip
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from helpers.agent import HERE

from numparity_agent.testing import main, spool_document, spooled

TOKEN = "s3cret-agent-token"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def server():
    """A loopback HTTP server recording requests and answering a configurable status."""
    received: list[dict] = []
    state = {"status": 201}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's naming
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append({"path": self.path, "headers": dict(self.headers), "body": body})
            payload = json.dumps({"id": len(received), "run_id": "x", "results": 0}).encode()
            self.send_response(state["status"])
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args):
            pass

    httpd = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", received, state
    httpd.shutdown()
    httpd.server_close()


def fake_document(run_id: str, finished_at: str) -> dict:
    return {
        "schema": "numparity.run/v1",
        "run_id": run_id,
        "finished_at": finished_at,
        "results": [],
    }


def test_unreachable_server_exits_3_and_keeps_the_document_spooled(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PYTHONPATH", str(HERE))
    spool = tmp_path / "spool"
    code = main(
        [
            "run",
            "--server",
            f"http://127.0.0.1:{closed_port()}",
            "--token",
            TOKEN,
            "--workloads",
            "agent_test_workloads:crash_in_strict",
            "--variants",
            "default",
            "--repeats",
            "1",
            "--spool",
            str(spool),
            "--upload-timeout",
            "5",
            "--max-wait",
            "0",
        ]
    )
    assert code == 3
    (path,) = spooled(spool)
    document = json.loads(path.read_text())
    assert document["schema"] == "numparity.run/v1"
    assert document["results"][0]["status"] == "ok"
    captured = capsys.readouterr()
    assert TOKEN not in captured.out + captured.err
    assert "kept" in captured.err


def test_flush_uploads_oldest_first_gzip_with_bearer_and_empties_the_spool(
    tmp_path, server, capsys
):
    url, received, _state = server
    spool = tmp_path / "spool"
    spool_document(fake_document("run-new", "2026-11-21T10:00:00Z"), spool)
    spool_document(fake_document("run-old", "2026-11-20T10:00:00Z"), spool)
    assert main(["flush", "--server", url, "--token", TOKEN, "--spool", str(spool)]) == 0
    assert spooled(spool) == []
    assert [json.loads(gzip.decompress(r["body"]))["run_id"] for r in received] == [
        "run-old",
        "run-new",
    ]
    headers = received[0]["headers"]
    assert received[0]["path"] == "/api/v1/runs"
    assert headers["Authorization"] == f"Bearer {TOKEN}"
    assert headers["Content-Encoding"] == "gzip"
    assert headers["Content-Type"] == "application/json"
    assert TOKEN not in capsys.readouterr().err


def test_server_error_keeps_and_rejection_moves_aside(tmp_path, server):
    url, _received, state = server
    spool = tmp_path / "spool"
    path = spool_document(fake_document("run-a", "2026-11-21T10:00:00Z"), spool)
    state["status"] = 503
    assert main(["flush", "--server", url, "--spool", str(spool), "--max-wait", "0"]) == 3
    assert spooled(spool) == [path]
    state["status"] = 409
    assert main(["flush", "--server", url, "--spool", str(spool)]) == 5
    assert spooled(spool) == []
    assert (Path(spool) / "rejected" / path.name).exists()


def test_spool_write_is_atomic_and_leaves_no_temporary_files(tmp_path):
    spool = tmp_path / "spool"
    path = spool_document(fake_document("run-a", "2026-11-21T10:00:00Z"), spool)
    assert sorted(p.name for p in spool.iterdir()) == [path.name]
    assert json.loads(path.read_text())["run_id"] == "run-a"
