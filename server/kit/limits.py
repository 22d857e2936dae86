"""Body first, database second: every request body is received whole, within a size
limit and a deadline, before the application sees the request.

A pure ASGI middleware, so it covers every route, the ones whose body FastAPI parses
itself (``/fingerprints/missing``, the sign-in form) as well as the run upload. Until the
last byte of the body has arrived no route, no dependency and so no database session
runs: a client that sends ``Content-Length: 100000`` and then nothing holds a socket and
a coroutine, never a connection of the pool or an open transaction, and after
``body_timeout_s`` it gets a 408 and the connection is closed. Bodies are held in memory
up to the limit, as the run upload held them before (it needs the whole body to decode
gzip and hash the document).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import anyio

from numparity_server.kit.errors import DomainError, PayloadTooLarge, RequestTimeout
from numparity_server.kit.handlers import error_response

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# The pages take only the sign-in and sign-out forms: a few hundred bytes.
PAGE_BODY_BYTES = 64 * 1024


class _ClientGone(Exception):
    """The client disconnected before its body was complete: nothing to answer."""


class BodyLimits:
    """413 past the limit (declared or streamed), 408 past the deadline; else the app
    gets the request with its whole body."""

    def __init__(self, app: ASGIApp, *, max_body_bytes: int, body_timeout_s: float) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s

    def limit(self, path: str) -> tuple[int, str]:
        """The byte limit of a request to ``path`` and what sets it (for the message)."""
        if path.startswith("/api/"):
            return self.max_body_bytes, "setting NUMPARITY_MAX_BODY_BYTES"
        return min(PAGE_BODY_BYTES, self.max_body_bytes), "the limit of a page's form"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit, source = self.limit(scope.get("path", ""))
        try:
            declared = _content_length(scope)
            if declared is not None and declared > limit:
                raise _too_large(limit, source)
            with anyio.fail_after(self.body_timeout_s):
                body = await _receive_body(receive, limit, source)
        except TimeoutError:
            await _refuse(RequestTimeout(
                f"the request body did not arrive within {self.body_timeout_s:g} s "
                "(setting NUMPARITY_BODY_TIMEOUT_S)"), scope, receive, send)
            return
        except DomainError as exc:
            await _refuse(exc, scope, receive, send)
            return
        except _ClientGone:
            return

        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: http.disconnect, when it comes

        await self.app(scope, replay, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            text = value.decode("latin-1").strip()
            return int(text) if text.isdigit() else None
    return None


def _too_large(limit: int, source: str) -> PayloadTooLarge:
    return PayloadTooLarge(f"request body exceeds the limit of {limit} bytes ({source})")


async def _receive_body(receive: Receive, limit: int, source: str) -> bytes:
    chunks: list[bytes] = []
    received = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientGone
        chunk = message.get("body", b"")
        received += len(chunk)
        if received > limit:
            raise _too_large(limit, source)
        if chunk:
            chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _refuse(error: DomainError, scope: Scope, receive: Receive, send: Send) -> None:
    """The error as the API's JSON body; the connection is closed after it (the rest of
    the body, if it ever comes, is not read)."""
    response = error_response(error.status_code, error.code, error.detail,
                              {**(error.headers or {}), "Connection": "close"})
    await response(scope, receive, send)
