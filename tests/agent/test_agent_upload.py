"""Spool and upload against a real local HTTP server and a closed port (design §2.6)."""

import json
from pathlib import Path

from helpers.agent import HERE
from helpers.agent_operations import Answer, closed_port_url, scripted_server

from numparity_agent.testing import main, spool_document, spooled

TOKEN = "s3cret-agent-token"


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
            closed_port_url(),
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


def test_flush_uploads_oldest_first_gzip_with_bearer_and_empties_the_spool(tmp_path, capsys):
    spool = tmp_path / "spool"
    spool_document(fake_document("run-new", "2026-11-21T10:00:00Z"), spool)
    spool_document(fake_document("run-old", "2026-11-20T10:00:00Z"), spool)
    with scripted_server(Answer(201)) as server:
        assert main(["flush", "--server", server.url, "--token", TOKEN,
                     "--spool", str(spool)]) == 0
    assert spooled(spool) == []
    assert server.run_ids() == ["run-old", "run-new"]
    path, headers, _body = server.requests[0]
    assert path == "/api/v1/runs"
    assert headers["Authorization"] == f"Bearer {TOKEN}"
    assert headers["Content-Encoding"] == "gzip"
    assert headers["Content-Type"] == "application/json"
    assert TOKEN not in capsys.readouterr().err


def test_server_error_keeps_and_rejection_moves_aside(tmp_path):
    spool = tmp_path / "spool"
    path = spool_document(fake_document("run-a", "2026-11-21T10:00:00Z"), spool)
    with scripted_server(Answer(503), Answer(409)) as server:
        assert main(["flush", "--server", server.url, "--spool", str(spool),
                     "--max-wait", "0"]) == 3
        assert spooled(spool) == [path]
        assert main(["flush", "--server", server.url, "--spool", str(spool)]) == 5
    assert spooled(spool) == []
    assert (Path(spool) / "rejected" / path.name).exists()


def test_spool_write_is_atomic_and_leaves_no_temporary_files(tmp_path):
    spool = tmp_path / "spool"
    path = spool_document(fake_document("run-a", "2026-11-21T10:00:00Z"), spool)
    assert sorted(p.name for p in spool.iterdir()) == [path.name]
    assert json.loads(path.read_text())["run_id"] == "run-a"
