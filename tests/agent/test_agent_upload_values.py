"""Whole values of large tensors (no blind spots): kept in the spool, sent when asked."""

from __future__ import annotations

import base64
import gzip
import json

import httpx
import pytest
import torch
from helpers.agent_upload import Recorder, agent_document, flush_with

from numparity_agent.testing import (
    MISSING_PATH,
    RUNS_PATH,
    VALUES_MAX,
    VALUES_PATH,
    ValuesStore,
    fingerprint,
    spool_document,
    values_dir,
)

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def spool_with_values(document, spool):
    """Spool `document` as `run` does, its large tensors' values kept beside it."""
    store = ValuesStore(values_dir(spool))
    generator = torch.Generator().manual_seed(7)
    for result in document["results"]:
        for tensor in result["tensors"]:
            if tensor["name"] == "conv1":  # large: rebuilt the way agent_document built it
                generator = torch.Generator().manual_seed(7)
                fingerprint(torch.randn((8, 16, 12, 12), generator=generator), store.keep)
    spool_document(document, spool)
    return store


def sent_values(recorder):
    """Hash -> the bytes of its values the agent sent, part by part, after the run (whose
    document carries none of a large tensor's values)."""
    (body,) = recorder.sent(RUNS_PATH)
    assert not [t for r in json.loads(gzip.decompress(body))["results"]
                for t in r.get("tensors", []) if "values" in t and t["name"] == "conv1"]
    sent: dict[str, bytes] = {}
    for path, part in recorder.requests:
        if path.startswith(VALUES_PATH + "/"):
            digest = path.rsplit("/", 1)[1]
            sent[digest] = sent.get(digest, b"") + part
    return sent


def test_values_travel_once_from_the_first_node_and_a_steady_node_sends_none(
        live_server, tmp_path, monkeypatch):
    first, second = agent_document("node-a"), agent_document("node-b")
    (conv1,) = {t["hash"] for r in first["results"] for t in r["tensors"]
                if t["name"] == "conv1"}
    assert 8 * 16 * 12 * 12 > VALUES_MAX and "values" not in first["results"][0]["tensors"][0]
    flags = ["--server", live_server.base_url, "--token", live_server.agent_token]

    spool_with_values(first, tmp_path / "a")
    recorder = Recorder()
    assert flush_with(monkeypatch, recorder, *flags, "--spool", str(tmp_path / "a")) == 0
    assert json.loads(recorder.sent(MISSING_PATH)[0])["values"] == [conv1]
    values = sent_values(recorder)
    assert list(values) == [conv1]
    expected = torch.randn((8, 16, 12, 12), generator=torch.Generator().manual_seed(7))
    assert values[conv1] == expected.numpy().tobytes()

    spool_with_values(second, tmp_path / "b")
    recorder = Recorder()
    assert flush_with(monkeypatch, recorder, *flags, "--spool", str(tmp_path / "b")) == 0
    assert sent_values(recorder) == {}  # the server holds them: nothing more travels


def test_values_that_are_not_the_hashs_bytes_are_refused_naming_the_tensor(live_server):
    document = agent_document("hostile")
    tensor = document["results"][0]["tensors"][0]
    forged = torch.zeros((8, 16, 12, 12)).numpy().tobytes()
    tensor["values"] = {"dtype": "float32", "data": base64.b64encode(forged).decode()}
    response = httpx.post(f"{live_server.base_url}{RUNS_PATH}", json=document,
                          headers=live_server.headers("agent"), timeout=30)
    assert response.status_code == 422
    assert "'conv1' values: their sha256 is not the tensor's hash" in response.text
    runs = httpx.get(f"{live_server.base_url}/api/v1/runs", params={"node": "hostile"},
                     headers=live_server.headers("reader"), timeout=30).json()
    assert runs["items"] == []
