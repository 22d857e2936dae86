"""Domain errors: what a service raises on purpose, with its HTTP status and code.

Free of web-framework imports so the CLI can use the services; ``kit.handlers`` maps
them to responses.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar


class DomainError(Exception):
    """Base of every error a service raises on purpose; ``code`` is the JSON ``error``."""

    status_code: ClassVar[int] = 400
    code: ClassVar[str] = "bad_request"
    headers: ClassVar[dict[str, str] | None] = None

    def __init__(self, detail: Any) -> None:
        super().__init__(detail if isinstance(detail, str) else repr(detail))
        self.detail = detail

    def response_headers(self) -> dict[str, str] | None:
        """The headers of its answer (a class's ``headers``, or the error's own)."""
        return self.headers


class BadRequest(DomainError):
    status_code = 400
    code = "bad_request"


class UnsupportedSchema(DomainError):
    status_code = 400
    code = "unsupported_schema"


class Unauthorized(DomainError):
    status_code = 401
    code = "unauthorized"
    headers = {"WWW-Authenticate": "Bearer"}


class Forbidden(DomainError):
    status_code = 403
    code = "forbidden"


class NotFound(DomainError):
    status_code = 404
    code = "not_found"


class RequestTimeout(DomainError):
    status_code = 408
    code = "request_timeout"


class TooManyRequests(DomainError):
    """Over a token's byte budget (kit.budget); ``wait``: seconds until it could be paid
    (the answer's ``Retry-After``)."""

    status_code = 429
    code = "too_many_requests"

    def __init__(self, detail: Any, *, wait: float) -> None:
        super().__init__(detail)
        self.wait = wait

    def response_headers(self) -> dict[str, str] | None:
        # Whole seconds, at least 1 (a route's refusal; the middleware's says the same).
        return {"Retry-After": str(max(1, math.ceil(self.wait)))}


class Conflict(DomainError):
    status_code = 409
    code = "conflict"


class PayloadTooLarge(DomainError):
    status_code = 413
    code = "payload_too_large"


class UnsupportedMediaType(DomainError):
    status_code = 415
    code = "unsupported_media_type"


class InvalidDocument(DomainError):
    """A well-formed request whose content is wrong: 422 naming the field(s)."""

    status_code = 422
    code = "validation_error"

    def __init__(self, errors: Sequence[dict[str, Any]]) -> None:
        super().__init__([{"loc": list(e["loc"]), "msg": str(e["msg"])} for e in errors])

    @classmethod
    def at(cls, loc: Sequence[str | int], msg: str) -> InvalidDocument:
        return cls([{"loc": list(loc), "msg": msg}])


class ServiceUnavailable(DomainError):
    status_code = 503
    code = "unavailable"
