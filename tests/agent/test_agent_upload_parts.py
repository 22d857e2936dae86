"""Uploads that always fit: the agent sends no body the server (or a proxy before it)
refuses for size, and never gives a run up for its size (issue 28).

A live server behind a fake proxy (an httpx transport) that refuses bodies over its own
limit with a bare 413, as nginx's client_max_body_size does: the agent halves what it
sends until it passes, the document in parts and the values in parts. Behind an older
server that takes no parts, a document too large stays in the spool, not rejected.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from helpers.agent_upload import agent_document

from numparity_agent import _cli  # patched: the backoff's sleep
from numparity_agent.testing import (
    MISSING_PATH,
    RUNS_PATH,
    UPLOADS_PATH,
    VALUES_PATH,
    ValuesStore,
    fingerprint,
    main,
    spool_document,
    spooled,
    upload_document,
    values_dir,
)

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

_CLIENT_INIT = httpx.Client.__init__


class Proxy(httpx.BaseTransport):
    """Forwards to the server; a body over ``limit`` gets a bare 413 (no JSON, no limit
    header). ``old``: the server predates parts (no max_body_bytes, no part routes).
    ``throttle``: every so many-th part gets 429 with Retry-After (a byte budget)."""

    def __init__(self, limit: int, *, old: bool = False, throttle: int = 0) -> None:
        self.limit, self.old, self.throttle = limit, old, throttle
        self.inner = httpx.HTTPTransport()
        self.sent: list[tuple[str, int, int]] = []  # (path, body bytes, status)
        self.parts = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        body = request.read()
        path = request.url.path
        # Parts that pass the size limit count towards the throttle.
        part = (path.startswith((UPLOADS_PATH, VALUES_PATH)) and request.method == "PUT"
                and len(body) <= self.limit)
        self.parts += part
        if len(body) > self.limit:
            response = httpx.Response(413, text="<html>413 Request Entity Too Large</html>")
        elif part and self.throttle and self.parts % self.throttle == 0:
            response = httpx.Response(429, headers={"Retry-After": "2"},
                                      json={"error": "too_many_bytes"})
        elif self.old and path.startswith((UPLOADS_PATH, VALUES_PATH)):
            response = httpx.Response(404, json={"detail": "Not Found"})
        else:
            response = self.inner.handle_request(request)
            if self.old and path == MISSING_PATH:
                response.read()
                answer = json.loads(response.content)
                answer.pop("max_body_bytes", None)
                answer["missing_values"] = []  # an old server never asks for values here
                response = httpx.Response(response.status_code, json=answer)
        self.sent.append((path, len(body), response.status_code))
        return response


def _through(proxy: Proxy, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every httpx client the agent makes (its CLI makes its own) goes through ``proxy``."""

    def init(self: httpx.Client, *args: Any, **kwargs: Any) -> None:
        kwargs["transport"] = proxy
        _CLIENT_INIT(self, *args, **kwargs)

    monkeypatch.setattr(httpx.Client, "__init__", init)


def _spool(document: dict[str, Any], spool: Path) -> ValuesStore:
    store = ValuesStore(values_dir(spool))
    conv1 = torch.randn((8, 16, 12, 12), generator=torch.Generator().manual_seed(7))
    fingerprint(conv1, store.keep)  # as `run` keeps a large tensor's values
    spool_document(document, spool)
    return store


def _values_missing(live_server: Any, document: dict[str, Any]) -> list[str]:
    """Of conv1's whole values (the large tensor `_spool` keeps), what the server asks."""
    conv1 = next(t["hash"] for t in document["results"][0]["tensors"] if t["name"] == "conv1")
    asked = httpx.post(f"{live_server.base_url}{MISSING_PATH}", json={"values": [conv1]},
                       headers=live_server.headers("agent"), timeout=30).json()
    return list(asked["missing_values"])


def test_behind_a_proxy_with_a_smaller_limit_the_agent_halves_its_parts(live_server, tmp_path):
    document = agent_document("behind-proxy")
    store = _spool(document, tmp_path)
    assert len(json.dumps(document)) > 8_000  # the document alone passes the proxy
    proxy = Proxy(limit=8_000)
    with httpx.Client(transport=proxy, timeout=30) as client:
        answer = upload_document(document, server=live_server.base_url,
                                 token=live_server.agent_token, client=client, values=store)
    assert answer.status == 201, answer.detail
    refused = [sent for sent in proxy.sent if sent[2] == 413]
    assert refused and all(size > proxy.limit for _path, size, _status in refused)
    assert any(path.startswith(UPLOADS_PATH) and status == 200
               for path, _size, status in proxy.sent), proxy.sent
    # The run is whole and the server holds conv1's values: it asks for none of them.
    run = httpx.get(f"{live_server.base_url}/api/v1/runs/{document['run_id']}",
                    headers=live_server.headers("reader"), timeout=30).json()
    assert len(run["results"]) == len(document["results"])
    assert _values_missing(live_server, document) == []
    assert sum(size for path, size, status in proxy.sent
               if path.startswith(VALUES_PATH) and status == 200) >= 8 * 16 * 12 * 12 * 4


def test_a_document_too_large_for_an_older_server_stays_in_the_spool(
        live_server, tmp_path, monkeypatch):
    document = agent_document("old-server")
    _spool(document, tmp_path)
    proxy = Proxy(limit=8_000, old=True)

    _through(proxy, monkeypatch)
    code = main(["flush", "--server", live_server.base_url, "--token",
                 live_server.agent_token, "--spool", str(tmp_path), "--max-wait", "0"])
    assert code != 0
    assert [path.name for path in spooled(tmp_path)] != []  # kept, for a newer server
    assert not (tmp_path / "rejected").exists()
    assert any(path == RUNS_PATH and status == 413 for path, _size, status in proxy.sent)


@pytest.fixture
def unmetered(monkeypatch):
    """The live server started after this has no byte budget of its own: the proxy's
    429s are the only throttle (the backoff's sleeps are not slept here)."""
    monkeypatch.setenv("NUMPARITY_TOKEN_BYTES_PER_S", "0")


def test_a_throttled_upload_goes_on_while_each_attempt_moves_it_forward(
        unmetered, live_server, tmp_path, monkeypatch):
    """A server's byte budget answers 429 every third part: each attempt gets two parts
    further, so the flush goes on past --max-wait until the run and its values are whole
    (waits add up to far more than --max-wait), and each attempt resumes where the last
    one stopped."""
    document = agent_document("throttled")
    _spool(document, tmp_path)
    proxy = Proxy(limit=8_000, throttle=3)
    delays: list[float] = []
    monkeypatch.setattr(_cli, "sleep", delays.append)

    _through(proxy, monkeypatch)
    code = main(["flush", "--server", live_server.base_url, "--token",
                 live_server.agent_token, "--spool", str(tmp_path), "--max-wait", "5"])
    assert code == 0
    assert spooled(tmp_path) == []
    throttled = [sent for sent in proxy.sent if sent[2] == 429]
    assert len(throttled) > 3 and sum(delays) > 5 and min(delays) >= 2
    # Each retry resumed where the server stood: no byte of the values was sent twice.
    assert sum(size for path, size, status in proxy.sent
               if path.startswith(VALUES_PATH) and status == 200) == 8 * 16 * 12 * 12 * 4
    assert _values_missing(live_server, document) == []


def test_a_throttle_that_lets_nothing_through_still_gives_up_at_max_wait(
        unmetered, live_server, tmp_path, monkeypatch):
    document = agent_document("throttled-shut")
    _spool(document, tmp_path)
    proxy = Proxy(limit=8_000, throttle=1)  # every part refused: no progress
    delays: list[float] = []
    monkeypatch.setattr(_cli, "sleep", delays.append)

    _through(proxy, monkeypatch)
    code = main(["flush", "--server", live_server.base_url, "--token",
                 live_server.agent_token, "--spool", str(tmp_path), "--max-wait", "5"])
    assert code != 0
    assert len(spooled(tmp_path)) == 1  # kept for the next run
    assert sum(delays) <= 5
