"""kit.limits.BodyLimits with plain ASGI messages: the application runs only once the
whole body is in; 413 past the limit, 408 past the deadline, without calling it."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from helpers.asgi import run_coroutine

from numparity_server.kit.limits import PAGE_BODY_BYTES, BodyLimits


class App:
    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        message = await receive()
        self.bodies.append(message["body"])
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})


def request(path: str, chunks: list[bytes], *, declared: int | None = None,
            stall: bool = False, max_body_bytes: int = 100) -> tuple[App, list[dict]]:
    app, sent = App(), []
    headers = [] if declared is None else [(b"content-length", str(declared).encode())]
    scope = {"type": "http", "method": "POST", "path": path, "headers": headers}
    pending = list(chunks)

    async def receive() -> dict:
        if pending:
            chunk = pending.pop(0)
            return {"type": "http.request", "body": chunk,
                    "more_body": bool(pending) or stall}
        await asyncio.Event().wait()  # the client sends nothing more
        raise AssertionError("unreachable")

    async def send(message: dict) -> None:
        sent.append(message)

    middleware = BodyLimits(app, max_body_bytes=max_body_bytes, body_timeout_s=0.05)
    run_coroutine(middleware(scope, receive, send))
    return app, sent


def answer(sent: list[dict]) -> tuple[int, dict[str, Any], dict[bytes, bytes]]:
    start, body = sent[0], b"".join(m.get("body", b"") for m in sent[1:])
    return start["status"], json.loads(body), dict(start["headers"])


def test_the_app_gets_the_whole_body_in_one_message():
    app, sent = request("/api/v1/runs", [b"ab", b"cd", b"e"])
    assert app.bodies == [b"abcde"] and sent[0]["status"] == 204


def test_a_declared_length_over_the_limit_is_413_before_anything_is_read():
    app, sent = request("/api/v1/runs", [], declared=101, stall=True)
    status, body, headers = answer(sent)
    assert (status, body["error"]) == (413, "payload_too_large")
    assert "NUMPARITY_MAX_BODY_BYTES" in body["detail"] and app.bodies == []
    assert headers[b"connection"] == b"close"


def test_streamed_bytes_over_the_limit_are_413():
    app, sent = request("/api/v1/fingerprints/missing", [b"x" * 60, b"x" * 60])
    assert answer(sent)[0] == 413 and app.bodies == []


def test_a_page_form_has_its_own_small_limit():
    app, sent = request("/login", [b"x" * (PAGE_BODY_BYTES + 1)],
                        max_body_bytes=10 * PAGE_BODY_BYTES)
    assert answer(sent)[0] == 413 and app.bodies == []


def test_a_body_that_stops_arriving_is_408_naming_the_setting():
    app, sent = request("/api/v1/runs", [b'{"schema"'], declared=50, stall=True)
    status, body, headers = answer(sent)
    assert (status, body["error"]) == (408, "request_timeout")
    assert "NUMPARITY_BODY_TIMEOUT_S" in body["detail"] and app.bodies == []
    assert headers[b"connection"] == b"close"
