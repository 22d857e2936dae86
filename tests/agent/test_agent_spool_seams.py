"""The spool at a lab's seams, through a live server (SQLite and PostgreSQL) and the real
agent in a child process: a run refused for what it says never blocks the runs after it,
and a wrong server address never loses one.

- A token bound to gpu-node-17 refuses a run made under a wrong `--node` (403
  node_forbidden): that run is set aside in rejected/ with the server's reason and the
  flush goes on; `numparity-agent spool` lists it and why, `spool resend` sends it again
  (here with a token that may write it), `spool drop` deletes one.
- `--server http://host:port/api/v1` (a 404) or an address where another web server
  answers (200, not a run's answer) is a configuration error: exit 2, the run stays in
  the spool (not rejected/), and the message names the address to use.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.agent import clean_env, run_agent
from helpers.agent_upload import agent_document
from helpers.processes import run_cli

from numparity_agent.testing import spool_document, spooled


def _document(node: str, minute: int) -> dict[str, Any]:
    document = agent_document(node)
    document["finished_at"] = f"2026-11-21T10:{minute:02d}:41Z"  # the spool's order
    return document


def _flush(server: str, token: str, spool: Path, *args: str) -> Any:
    return run_agent(*args or ("flush",), "--server", server, "--spool", str(spool),
                     env=clean_env(NUMPARITY_TOKEN=token, NUMPARITY_MAX_WAIT="0"))


def _stored(live_server: Any, run_id: str) -> bool:
    response = httpx.get(f"{live_server.base_url}/api/v1/runs/{run_id}",
                         headers=live_server.headers("reader"), timeout=30)
    assert response.status_code in (200, 404), response.text
    return response.status_code == 200


def test_a_run_refused_for_its_node_is_set_aside_and_the_flush_goes_on(
        live_server: Any, tmp_path: Path) -> None:
    bound = run_cli("token", "create", "--role", "agent", "--node", "gpu-node-17",
                    "--label", "gpu-node-17", database_url=live_server.database_url
                    ).stdout.strip()
    spool = tmp_path / "spool"
    # Two runs made under a wrong --node ('vm', the host name), then the right one.
    wrong = [_document("vm", 1), _document("vm", 2)]
    right = _document("gpu-node-17", 3)
    for document in (*wrong, right):
        spool_document(document, spool)

    done = _flush(live_server.base_url, bound, spool)
    assert done.returncode == 5, done.stderr
    assert _stored(live_server, right["run_id"])  # the flush went on past the refusals
    assert spooled(spool) == []
    rejected = sorted((spool / "rejected").glob("*.json"))
    assert [path.name.endswith(f"{d['run_id']}.json") for path, d in zip(
        rejected, wrong, strict=True)] == [True, True]
    reason = rejected[0].with_name(rejected[0].name + ".reason").read_text()
    assert "node_forbidden" in reason and "gpu-node-17" in reason and "'vm'" in reason

    # The next run, under the right --node, goes through: nothing sticks.
    later = _document("gpu-node-17", 4)
    spool_document(later, spool)
    done = _flush(live_server.base_url, bound, spool)
    assert done.returncode == 0, done.stderr
    assert _stored(live_server, later["run_id"])

    # What waits and why.
    listed = run_agent("spool", "--spool", str(spool), env=clean_env())
    assert listed.returncode == 0, listed.stderr
    assert "2 rejected" in listed.stdout
    for document in wrong:
        assert f"run {document['run_id']} of node 'vm'" in listed.stdout
    assert "may not write runs of node 'vm'" in listed.stdout

    # Sent again with a token that may write node 'vm'; the other one given up.
    done = _flush(live_server.base_url, live_server.agent_token, spool, "spool", "resend",
                  wrong[0]["run_id"])
    assert done.returncode == 0, done.stderr
    assert _stored(live_server, wrong[0]["run_id"])
    dropped = run_agent("spool", "drop", rejected[1].name, "--spool", str(spool),
                        env=clean_env())
    assert dropped.returncode == 0, dropped.stderr
    assert list((spool / "rejected").iterdir()) == []
    assert not _stored(live_server, wrong[1]["run_id"])


class _NotNumparity(http.server.BaseHTTPRequestHandler):
    """Another web server at the address: 200 and a page for anything."""

    def _page(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        body = b"<html><body>Welcome to nginx!</body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = _page

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def other_web_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotNumparity)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_a_wrong_server_address_keeps_the_runs_and_says_which_to_use(
        live_server: Any, tmp_path: Path, other_web_server: str) -> None:
    spool = tmp_path / "spool"
    documents = [_document("node-a", 1), _document("node-a", 2)]
    for document in documents:
        spool_document(document, spool)
    names = [path.name for path in spooled(spool)]

    for address in (f"{live_server.base_url}/api/v1", other_web_server):
        done = _flush(address, live_server.agent_token, spool)
        assert done.returncode == 2, done.stderr
        assert [path.name for path in spooled(spool)] == names  # both kept, none rejected
        assert not (spool / "rejected").exists()
        assert "not as numparity's API does" in done.stderr
    # The message names the address to use when the API's path was given.
    done = _flush(f"{live_server.base_url}/api/v1", live_server.agent_token, spool)
    assert f"without /api/v1: {live_server.base_url} " in done.stderr

    done = _flush(live_server.base_url, live_server.agent_token, spool)
    assert done.returncode == 0, done.stderr
    assert spooled(spool) == []
    assert all(_stored(live_server, d["run_id"]) for d in documents)
