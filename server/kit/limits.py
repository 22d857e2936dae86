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

A body sent to the API is paid for from its token's byte budget (``kit.budget``): over
it, 429 with ``Retry-After``, before the body is read when ``Content-Length`` gives its
size, so one token cannot take the server's time from the others. A route that decodes
gzip pays the rest of the decompressed size (``charge_decoded``) before it parses.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import anyio

from numparity_server.kit.budget import (
    MIN_REQUEST_COST,
    TokenBudget,
    budget_key,
    retry_after,
)
from numparity_server.kit.errors import (
    DomainError,
    PayloadTooLarge,
    RequestTimeout,
    TooManyRequests,
)
from numparity_server.kit.handlers import error_response

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# The pages take only the sign-in and sign-out forms: a few hundred bytes.
PAGE_BODY_BYTES = 64 * 1024
API_LIMIT = "setting NUMPARITY_MAX_BODY_BYTES"
# How long an answer over a token's budget is held back at most (kit.budget).
TARPIT_S = 1.0


class _ClientGone(Exception):
    """The client disconnected before its body was complete: nothing to answer."""


class BodyLimits:
    """413 past the limit (declared or streamed), 408 past the deadline; else the app
    gets the request with its whole body."""

    def __init__(self, app: ASGIApp, *, max_body_bytes: int, body_timeout_s: float,
                 token_bytes_per_s: float = 0.0, max_document_bytes: int = 0) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s
        # The bucket holds the largest thing one upload may decode to (a document in
        # parts: NUMPARITY_MAX_DOCUMENT_BYTES), so whatever passes the limits can be paid
        # at once, and a new node's first upload (its whole document and values) is not
        # throttled; the rate bounds what a token sends beyond it.
        self.budget = TokenBudget(rate=token_bytes_per_s,
                                  burst=max(max_body_bytes, max_document_bytes))

    def limit(self, path: str) -> tuple[int, str]:
        """The byte limit of a request to ``path`` and what sets it (for the message)."""
        if path.startswith("/api/"):
            return self.max_body_bytes, API_LIMIT
        return min(PAGE_BODY_BYTES, self.max_body_bytes), "the limit of a page's form"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        limit, source = self.limit(path)
        paid = not (self.budget.enabled and path.startswith("/api/"))
        if not paid:
            scope.setdefault("state", {})[_CHARGE] = _Charge(
                self.budget, budget_key(_header(scope, b"authorization")))
        try:
            declared = _content_length(scope)
            if declared is not None and declared > limit:
                raise _too_large(limit, source)
            if not paid and declared is not None:
                self._pay(scope, declared)
                paid = True
            with anyio.fail_after(self.body_timeout_s):
                body = await _receive_body(receive, limit, source)
            if not paid:
                self._pay(scope, len(body))
        except TimeoutError:
            await _refuse(RequestTimeout(
                f"the request body did not arrive within {self.body_timeout_s:g} s "
                "(setting NUMPARITY_BODY_TIMEOUT_S)"), scope, receive, send)
            return
        except TooManyRequests as exc:
            # A client over its budget waits for its answer (up to TARPIT_S): one that
            # ignores Retry-After and asks again at once costs the server a sleeping
            # coroutine, not a request's work, many times a second.
            await anyio.sleep(min(exc.wait, TARPIT_S))
            await _refuse(exc, scope, receive, send, {"Retry-After": retry_after(exc.wait)})
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

    def _pay(self, scope: Scope, size: int) -> None:
        """Take a body's cost from its token's budget; TooManyRequests when it cannot pay."""
        scope["state"][_CHARGE].pay(size)


# Where the middleware leaves a request's budget for the route (Starlette's request.state).
_CHARGE = "numparity_budget_charge"


class _Charge:
    """One request's token budget: what it has paid, and what it can still be charged."""

    def __init__(self, budget: TokenBudget, key: bytes) -> None:
        self.budget, self.key, self.paid = budget, key, 0

    def pay(self, size: int, *, least: int = MIN_REQUEST_COST, what: str = "sent") -> None:
        if size <= 0:
            return
        wait = self.budget.spend(self.key, size, least=least)
        if wait > 0:
            raise TooManyRequests(
                f"this token has {what} more than its budget of {self.budget.rate:g} bytes "
                f"a second (setting NUMPARITY_TOKEN_BYTES_PER_S); retry in {wait:.0f} s",
                wait=wait)
        self.paid += max(size, least)


def charge_decoded(scope: Scope, decoded: int) -> None:
    """Charge a request's token for the bytes its body decompressed to beyond what the
    body paid on arrival (TooManyRequests, with the wait, when the budget cannot pay:
    the body is then not parsed). Nothing without a budget (pages, a budget turned off).

    One request pays at most the bucket, arrival and decoding together: a bucket that
    has refilled always pays it, so no body within the limits waits for ever (it
    decoding past the bucket would otherwise cost more than the bucket can hold)."""
    charge = scope.get("state", {}).get(_CHARGE)
    if charge is None:
        return
    owed = min(decoded, int(charge.budget.burst)) - charge.paid
    if owed > 0:
        charge.pay(owed, least=0, what="sent (decompressed)")


def charge_computation(scope: Scope, cost: int) -> None:
    """Charge a request's token ``cost`` bytes for a computation the server does for it
    (a `check` plan nothing kept): a GET pays nothing for its body, so what it makes the
    server compute is what it spends (TooManyRequests, with the wait, when the budget
    cannot pay). Nothing without a budget."""
    charge = scope.get("state", {}).get(_CHARGE)
    if charge is not None:
        charge.pay(cost, least=0, what="asked the server to compute")


def _header(scope: Scope, wanted: bytes) -> bytes | None:
    for name, value in scope.get("headers", ()):
        if name == wanted:
            return bytes(value)
    return None


def _content_length(scope: Scope) -> int | None:
    value = _header(scope, b"content-length")
    if value is None:
        return None
    text = value.decode("latin-1").strip()
    return int(text) if text.isdigit() else None


def _too_large(limit: int, source: str) -> PayloadTooLarge:
    # Only the API's limit is announced: a client splits its uploads by it.
    return PayloadTooLarge(f"request body exceeds the limit of {limit} bytes ({source})",
                           limit=limit if source == API_LIMIT else None)


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


async def _refuse(error: DomainError, scope: Scope, receive: Receive, send: Send,
                  headers: dict[str, str] | None = None) -> None:
    """The error as the API's JSON body; the connection is closed after it (the rest of
    the body, if it ever comes, is not read)."""
    response = error_response(error.status_code, error.code, error.detail,
                              {**(error.response_headers() or {}), **(headers or {}),
                               "Connection": "close"})
    await response(scope, receive, send)
