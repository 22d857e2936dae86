"""Op traces travel once (design §2.8, §2.10): a steady node uploads no trace body, a new
node of a known environment is told the server has them, and a trace the server forgot
is sent again. Against a real server, with the agent's own traces and flush."""

from __future__ import annotations

import copy
import gzip
import json
import uuid
from typing import Any

import pytest
import torch
from helpers.agent_upload import Recorder, flush_with

from numparity_agent.testing import (
    MISSING_PATH,
    RUNS_PATH,
    build_document,
    capture_environment,
    load_workload,
    run_workload,
    spool_document,
    spooled,
    utc_now,
    variant,
)

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def traced_document() -> dict[str, Any]:
    """A real agent document of two traced results (mlp and probes, default)."""
    results = [run_workload(load_workload(name), variant=variant("default"),
                            device=torch.device("cpu"), repeats=1, trace=True)
               for name in ("mlp", "probes")]
    assert all("trace" in r for r in results)
    return build_document(node="node-a", labels={}, environment=capture_environment(),
                          results=results, started_at=utc_now(), finished_at=utc_now())


def _run_of(document: dict[str, Any], node: str) -> dict[str, Any]:
    run = copy.deepcopy(document)
    run["run_id"] = str(uuid.uuid4())
    run["node"]["name"] = node
    return run


def _bodies(recorder: Recorder) -> list[list[str]]:
    """The trace hashes each POST /runs carried a body of."""
    return [[t["hash"] for t in json.loads(gzip.decompress(body)).get("traces") or []]
            for body in recorder.sent(RUNS_PATH)]


def _flush(monkeypatch, live_server, spool, document) -> Recorder:
    spool_document(document, spool)
    recorder = Recorder()
    code = flush_with(monkeypatch, recorder, "--server", live_server.base_url, "--token",
                      live_server.agent_token, "--spool", str(spool))
    assert code == 0 and spooled(spool) == []
    return recorder


def test_a_trace_travels_once(traced_document, live_server, tmp_path, monkeypatch):
    hashes = sorted(t["hash"] for t in traced_document["traces"])
    spool = tmp_path / "spool-a"
    first = _flush(monkeypatch, live_server, spool, _run_of(traced_document, "node-a"))
    assert [sorted(b) for b in _bodies(first)] == [hashes]

    # The same node's next run: the agent knows the server has everything, one request.
    steady = _flush(monkeypatch, live_server, spool, _run_of(traced_document, "node-a"))
    assert [p for p, _ in steady.requests] == [RUNS_PATH] and _bodies(steady) == [[]]

    # Another node of the same environment, no memory: it asks, and sends no body.
    other = _flush(monkeypatch, live_server, tmp_path / "spool-b",
                   _run_of(traced_document, "node-b"))
    (question,) = [json.loads(q) for q in other.sent(MISSING_PATH) if b"traces" in q]
    assert sorted(question["traces"]) == hashes
    assert _bodies(other) == [[]]


def test_a_trace_the_server_forgot_is_sent_again(traced_document, live_server, tmp_path,
                                                 monkeypatch):
    from sqlalchemy import create_engine, text

    spool = tmp_path / "spool"
    _flush(monkeypatch, live_server, spool, _run_of(traced_document, "node-a"))
    # As if retention had dropped one trace (and the manifests' memory still had it).
    forgotten = traced_document["traces"][0]["hash"]
    engine = create_engine(live_server.database_url)
    with engine.begin() as connection:
        connection.execute(text("UPDATE outcomes SET trace_hash = NULL WHERE trace_hash = :h"),
                           {"h": forgotten})
        connection.execute(text("DELETE FROM traces WHERE hash = :h"), {"h": forgotten})
    engine.dispose()
    again = _flush(monkeypatch, live_server, spool, _run_of(traced_document, "node-a"))
    # The fast path's reference is refused naming the trace; asking, the body goes.
    assert _bodies(again)[0] == [] and forgotten in _bodies(again)[-1]
