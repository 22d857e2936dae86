"""A token's byte budget (kit.budget): the bucket's arithmetic against a recomputation,
the middleware's 429 before the body is read, and the live app: one token over its
budget is refused while another token still uploads."""

from __future__ import annotations

import gzip
import json
from typing import Any

import pytest
from helpers.asgi import run_coroutine
from helpers.documents import run_document

from numparity_server.auth import service as auth_service
from numparity_server.kit import budget as budget_module
from numparity_server.kit import limits
from numparity_server.kit.budget import MIN_REQUEST_COST, TokenBudget, budget_key
from numparity_server.kit.db import get_engine, session_factory
from numparity_server.kit.limits import BodyLimits

MIB = 1024 * 1024


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_bucket_pays_its_burst_then_refills_at_its_rate():
    clock = Clock()
    budget = TokenBudget(rate=MIB, burst=4 * MIB, clock=clock)
    key = budget_key(b"Bearer a")
    assert [budget.spend(key, MIB) for _ in range(4)] == [0.0] * 4
    # Empty: the next MiB can be paid in exactly one second, and nothing is taken.
    assert budget.spend(key, MIB) == pytest.approx(1.0)
    assert budget.spend(key, MIB // 2) == pytest.approx(0.5)
    clock.now += 0.5
    assert budget.spend(key, MIB // 2) == 0.0
    # Refilling stops at the burst, however long the token was quiet.
    clock.now += 3600
    assert [budget.spend(key, 2 * MIB) for _ in range(3)][:2] == [0.0, 0.0]
    assert budget.spend(key, MIB) > 0


def test_small_requests_cost_the_minimum_and_tokens_do_not_share():
    clock = Clock()
    budget = TokenBudget(rate=MIN_REQUEST_COST, burst=10 * MIN_REQUEST_COST, clock=clock)
    paid = sum(budget.spend(budget_key(b"Bearer flood"), 10) == 0.0 for _ in range(50))
    assert paid == 10
    assert budget.spend(budget_key(b"Bearer honest"), 10) == 0.0


def test_a_zero_rate_turns_the_budget_off():
    budget = TokenBudget(rate=0, burst=MIB)
    assert all(budget.spend(b"k", MIB) == 0.0 for _ in range(100))


def test_the_table_holds_only_tokens_in_debt(monkeypatch):
    """A token whose bucket has refilled is forgotten; a flood of fake tokens cannot grow
    the table past MAX_BUCKETS."""
    clock = Clock()
    budget = TokenBudget(rate=MIB, burst=MIB, clock=clock)
    for i in range(100):
        budget.spend(budget_key(f"Bearer {i}".encode()), MIB)
    assert len(budget) == 100
    clock.now += 2  # every bucket has refilled
    budget.spend(budget_key(b"Bearer 0"), MIB)
    monkeypatch.setattr(budget_module, "MAX_BUCKETS", 10)
    budget.spend(budget_key(b"Bearer new"), MIB)
    assert len(budget) <= 10
    # The one still in debt is kept: it cannot pay again at once.
    assert budget.spend(budget_key(b"Bearer 0"), MIB) > 0


def asgi_post(middleware: BodyLimits, token: bytes, size: int, *, declared: bool) -> tuple[
        int, dict[str, Any], dict[bytes, bytes], list[bytes]]:
    received: list[bytes] = []
    bodies: list[bytes] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        bodies.append((await receive())["body"])
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    middleware.app = app
    headers = [(b"authorization", token)]
    if declared:
        headers.append((b"content-length", str(size).encode()))
    scope = {"type": "http", "method": "POST", "path": "/api/v1/runs", "headers": headers}
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        received.append(b"x")
        return {"type": "http.request", "body": b"x" * size, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    run_coroutine(middleware(scope, receive, send))
    start = sent[0]
    body = b"".join(m.get("body", b"") for m in sent[1:])
    return start["status"], json.loads(body) if body else {}, dict(start["headers"]), received


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
def test_over_budget_is_429_with_retry_after_naming_the_setting(declared, monkeypatch):
    held: list[float] = []

    async def sleep(seconds: float) -> None:
        held.append(seconds)

    monkeypatch.setattr(limits.anyio, "sleep", sleep)
    middleware = BodyLimits(lambda *a: None, max_body_bytes=MIB, body_timeout_s=5,  # type: ignore[arg-type]
                            token_bytes_per_s=MIB / 10)
    assert asgi_post(middleware, b"Bearer hostile", MIB, declared=declared)[0] == 204
    status, body, headers, received = asgi_post(middleware, b"Bearer hostile", MIB,
                                                declared=declared)
    assert (status, body["error"]) == (429, "too_many_requests")
    assert "NUMPARITY_TOKEN_BYTES_PER_S" in body["detail"]
    assert 9 <= int(headers[b"retry-after"]) <= 11  # 1 MiB at 0.1 MiB/s
    # The answer is held back (at most TARPIT_S): a client that asks again at once
    # gets few answers a second.
    assert held == [limits.TARPIT_S]
    # With a declared length the body is refused before a byte of it is read.
    assert received == ([] if declared else [b"x"])
    assert asgi_post(middleware, b"Bearer honest", MIB, declared=declared)[0] == 204


def test_the_app_throttles_one_token_and_not_another(make_api):
    api = make_api(token_bytes_per_s=1024.0, max_body_bytes=MIB, max_document_bytes=MIB)
    other = api.agent
    with session_factory(get_engine(api.settings))() as session:
        token = auth_service.create_token(session=session, role="agent", label="hostile").token
    hostile = {"Authorization": f"Bearer {token}"}
    answers = []
    for _ in range(20):  # requests of at least 64 KiB each: over a 1 MiB burst at the 17th
        answers.append(api.client.post("/api/v1/fingerprints/missing",
                                       json={"hashes": ["0" * 64]}, headers=hostile))
        if answers[-1].status_code == 429:
            break
    statuses = [a.status_code for a in answers]
    assert statuses[:16] == [200] * 16 and statuses[-1] == 429
    refused = answers[statuses.index(429)]
    assert refused.json()["error"] == "too_many_requests"
    assert int(refused.headers["Retry-After"]) >= 1
    # Another token is not slowed down by it: its run is stored.
    assert api.client.post("/api/v1/runs", json=run_document("honest"),
                           headers=other).status_code == 201
    # Reads are not budgeted.
    assert api.client.get("/api/v1/runs", headers=api.reader).status_code == 200


# Spellings of one header that authenticate as the same token (issue 30, finding 5).
SPELLINGS = ("Bearer {}", "bearer {}", "BEARER {}", "Bearer  {}", " Bearer {}", "Bearer {} ",
             "bEaReR   {}", "BeArEr {}  ")


def test_every_spelling_of_a_token_is_one_budget():
    token = "np_abc"
    keys = {budget_key(spelling.format(token).encode()) for spelling in SPELLINGS}
    assert len(keys) == 1
    assert budget_key(b"Bearer np_other") not in keys


def test_the_app_charges_every_spelling_of_a_token_to_one_budget(make_api):
    """Authentication reads the scheme in any case and strips spaces: so does the budget.
    Before, each spelling had a bucket of its own (8 spellings, 8 bursts)."""
    api = make_api(token_bytes_per_s=1024.0, max_body_bytes=MIB, max_document_bytes=MIB)
    token = api.agent["Authorization"].split()[1]
    statuses = []
    for i in range(20):  # at least 64 KiB each: a 1 MiB burst pays 16 of them
        headers = {"Authorization": SPELLINGS[i % len(SPELLINGS)].format(token)}
        statuses.append(api.client.post("/api/v1/fingerprints/missing",
                                        json={"hashes": ["0" * 64]},
                                        headers=headers).status_code)
        if statuses[-1] == 429:
            break
    assert statuses == [200] * 16 + [429]


def test_a_gzip_body_pays_its_decompressed_size(make_api):
    """What the server works on and stores is the decompressed body: a few KiB of gzip
    that decompress to 800 KiB cost 800 KiB (before, the 64 KiB minimum)."""
    api = make_api(token_bytes_per_s=1024.0, max_body_bytes=MIB, max_document_bytes=MIB)
    body = json.dumps({"hashes": ["0" * 64] * 12_000}).encode()
    assert len(body) > 790_000
    packed = gzip.compress(body)
    assert len(packed) < 16 * 1024
    headers = {**api.agent, "Content-Type": "application/json", "Content-Encoding": "gzip"}
    first = api.client.post("/api/v1/fingerprints/missing", content=packed, headers=headers)
    assert first.status_code == 200, first.text
    second = api.client.post("/api/v1/fingerprints/missing", content=packed, headers=headers)
    assert second.status_code == 429, second.text
    assert "decompressed" in second.json()["detail"]
    # ~720 KiB of decompressed bytes at 1 KiB/s, less the ~180 KiB the bucket still held.
    assert int(second.headers["Retry-After"]) >= 500
    # Small plain bodies of another token still pass.
    with session_factory(get_engine(api.settings))() as session:
        other = auth_service.create_token(session=session, role="agent", label="other").token
    assert api.client.post("/api/v1/fingerprints/missing", json={"hashes": ["0" * 64]},
                           headers={"Authorization": f"Bearer {other}"}).status_code == 200
