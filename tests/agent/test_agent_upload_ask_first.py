"""Ask-first uploads against a real server (design §3.2): only missing fingerprints travel."""

from __future__ import annotations

import gzip
import json

import httpx
import pytest
import torch
from helpers.agent_upload import Recorder, agent_document, flush_with

from numparity_agent.testing import (
    MISSING_PATH,
    RUNS_PATH,
    KnownManifests,
    fingerprint,
    known_manifests_file,
    manifest_hash,
    spool_document,
    spooled,
    upload_document,
)

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def test_second_node_on_known_tensors_uploads_references_only(live_server, tmp_path,
                                                              monkeypatch):
    first, second = agent_document("node-a"), agent_document("node-b")
    spool = tmp_path / "spool"
    flags = ["--server", live_server.base_url, "--token", live_server.agent_token,
             "--spool", str(spool)]

    first_path = spool_document(first, spool)
    full_text = first_path.read_bytes()
    recorder = Recorder()
    assert flush_with(monkeypatch, recorder, *flags) == 0
    (first_body,) = recorder.sent(RUNS_PATH)
    # Nothing known yet: the document goes whole (each fingerprint once).
    assert json.loads(gzip.decompress(first_body)) == json.loads(full_text)

    # Another node: its own spool, so no memory of what the server stored.
    spool_b = tmp_path / "spool-b"
    flags_b = ["--server", live_server.base_url, "--token", live_server.agent_token,
               "--spool", str(spool_b)]
    second_path = spool_document(second, spool_b)
    assert json.loads(second_path.read_bytes()) == second  # the spool keeps it whole
    recorder = Recorder()
    assert flush_with(monkeypatch, recorder, *flags_b) == 0
    assert spooled(spool_b) == []
    # One question, about the two results' manifests; the server has both.
    (question,) = recorder.sent(MISSING_PATH)
    asked = json.loads(question)
    assert asked["hashes"] == []
    assert sorted(asked["manifests"]) == sorted({manifest_hash(r["tensors"])
                                                 for r in second["results"]})
    (second_body,) = recorder.sent(RUNS_PATH)
    sent = json.loads(gzip.decompress(second_body))
    assert all("tensors" not in r and r["manifest"] == manifest_hash(original["tensors"])
               for r, original in zip(sent["results"], second["results"], strict=True))
    assert len(second_body) * 10 < len(first_body), (len(second_body), len(first_body))

    summary = httpx.get(f"{live_server.base_url}/api/v1/runs/{second['run_id']}",
                        headers=live_server.headers("reader"), timeout=10).json()
    assert summary["node"] == "node-b"
    assert [(r["variant"], r["status"], r["tensors"]) for r in summary["results"]] == [
        ("default", "ok", 3), ("strict", "ok", 3)]
    first_summary = httpx.get(f"{live_server.base_url}/api/v1/runs/{first['run_id']}",
                              headers=live_server.headers("reader"), timeout=10).json()
    assert ([r["manifest_hash"] for r in summary["results"]]
            == [r["manifest_hash"] for r in first_summary["results"]])


def test_retry_after_a_lost_answer_is_the_same_run(live_server):
    """A run first stored with full fingerprints, sent again as references: 200, not 409."""
    document = agent_document("node-a")
    kwargs = {"server": live_server.base_url, "token": live_server.agent_token}
    assert upload_document(document, **kwargs).status == 201
    assert upload_document(document, **kwargs).status == 200


def test_unknown_reference_is_retried_once_with_the_full_document(live_server, monkeypatch):
    """The server forgot a fingerprint between the question and the upload (retention)."""
    from numparity_agent import _upload

    document = agent_document("node-a")
    # "I have them all": manifests and fingerprints alike.
    monkeypatch.setattr(_upload, "_ask_missing",
                        lambda *args, **kwargs: _upload._Missing(set(), set()))
    recorder = Recorder()
    with httpx.Client(timeout=30, event_hooks={"request": [recorder]}) as client:
        outcome = _upload.upload_document(document, server=live_server.base_url,
                                          token=live_server.agent_token, client=client)
    assert outcome.status == 201, outcome.detail
    slim, full = recorder.sent(RUNS_PATH)
    assert all("tensors" not in r and "manifest" in r
               for r in json.loads(gzip.decompress(slim))["results"])
    assert json.loads(gzip.decompress(full)) == document


def test_a_result_with_one_new_tensor_sends_only_that_fingerprint(live_server):
    """Known manifests travel as their hash; a changed result as references plus the one
    new fingerprint; the server stores the run complete."""
    first = agent_document("node-a")
    kwargs = {"server": live_server.base_url, "token": live_server.agent_token}
    assert upload_document(first, **kwargs).status == 201

    second = agent_document("node-b")
    changed = second["results"][1]["tensors"][2]
    changed.update(fingerprint(torch.ones(8, 10)))
    recorder = Recorder()
    with httpx.Client(timeout=30, event_hooks={"request": [recorder]}) as client:
        outcome = upload_document(second, client=client, **kwargs)
    assert outcome.status == 201, outcome.detail
    manifests_question, hashes_question = (json.loads(b) for b in recorder.sent(MISSING_PATH))
    assert len(manifests_question["manifests"]) == 2 and manifests_question["hashes"] == []
    assert sorted(hashes_question["hashes"]) == sorted(
        t["hash"] for t in second["results"][1]["tensors"])
    (body,) = recorder.sent(RUNS_PATH)
    default, strict = json.loads(gzip.decompress(body))["results"]
    assert default["manifest"] == manifest_hash(first["results"][0]["tensors"])
    assert [set(t) > {"name", "kind", "order", "hash"} for t in strict["tensors"]] == [
        False, False, True]

    summary = httpx.get(f"{live_server.base_url}/api/v1/runs/{second['run_id']}",
                        headers=live_server.headers("reader"), timeout=10).json()
    assert [r["tensors"] for r in summary["results"]] == [3, 3]
    assert summary["results"][1]["manifest_hash"] == manifest_hash(
        second["results"][1]["tensors"])


def test_server_without_the_question_gets_the_full_document(tmp_path, monkeypatch):
    """An older server answers 404 to /fingerprints/missing: send everything."""
    seen: list[tuple[str, bytes]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.path, request.content))
        if request.url.path == MISSING_PATH:
            return httpx.Response(404, json={"detail": "Not Found"})
        return httpx.Response(201, json={"id": 1, "run_id": "x", "results": 2})

    document = agent_document("node-a")
    with httpx.Client(transport=httpx.MockTransport(handler)) as client:
        outcome = upload_document(document, server="http://numparity.invalid", token="t",
                                  client=client)
    assert outcome.ok
    assert [path for path, _ in seen] == [MISSING_PATH, RUNS_PATH]
    assert json.loads(gzip.decompress(seen[1][1])) == document


def test_a_node_that_does_not_change_sends_one_small_request(live_server, tmp_path,
                                                            monkeypatch):
    """The spool remembers which manifests the server stored: the next identical run goes
    as manifest references without a question; the memory is never taken for a run."""
    spool = tmp_path / "spool"
    flags = ["--server", live_server.base_url, "--token", live_server.agent_token,
             "--spool", str(spool)]
    spool_document(agent_document("node-a"), spool)
    assert flush_with(monkeypatch, Recorder(), *flags) == 0
    assert known_manifests_file(spool).exists() and spooled(spool) == []

    second = agent_document("node-a")
    spool_document(second, spool)
    recorder = Recorder()
    assert flush_with(monkeypatch, recorder, *flags) == 0
    assert recorder.sent(MISSING_PATH) == []
    (body,) = recorder.sent(RUNS_PATH)
    assert all("tensors" not in r for r in json.loads(gzip.decompress(body))["results"])
    summary = httpx.get(f"{live_server.base_url}/api/v1/runs/{second['run_id']}",
                        headers=live_server.headers("reader"), timeout=10).json()
    assert [r["tensors"] for r in summary["results"]] == [3, 3]


def test_a_manifest_the_server_forgot_falls_back_to_asking(live_server, tmp_path):
    document = agent_document("node-a")
    known = KnownManifests(tmp_path / ".known.json", live_server.base_url)
    known.remember([manifest_hash(r["tensors"]) for r in document["results"]])
    recorder = Recorder()
    with httpx.Client(timeout=30, event_hooks={"request": [recorder]}) as client:
        outcome = upload_document(document, server=live_server.base_url,
                                  token=live_server.agent_token, client=client, known=known)
    assert outcome.status == 201, outcome.detail
    # The reference was refused (422), then the agent asked and sent what was missing.
    assert [path for path, _ in recorder.requests] == [RUNS_PATH, MISSING_PATH, MISSING_PATH,
                                                       RUNS_PATH]
    reloaded = KnownManifests(tmp_path / ".known.json", live_server.base_url)
    assert all(manifest_hash(r["tensors"]) in reloaded for r in document["results"])
