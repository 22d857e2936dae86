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
    headers: dict[str, str] | None = None  # extra answer headers (a class or an instance)

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


class NodeForbidden(Forbidden):
    """A token bound to other nodes sent a document of this node: the document is
    refused, not the token (the agent sets it aside and sends the others)."""

    code = "node_forbidden"


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


# The header of a 413 that names the body limit in bytes: an agent sizes its requests by
# it (a proxy's own 413 lacks it; the agent then halves what it sends).
BODY_LIMIT_HEADER = "Numparity-Max-Body-Bytes"


class PayloadTooLarge(DomainError):
    """A request body over a byte limit; ``limit`` (the API's body limit) travels in the
    ``Numparity-Max-Body-Bytes`` header so that a client can split what it sends."""

    status_code = 413
    code = "payload_too_large"

    def __init__(self, detail: Any, *, limit: int | None = None) -> None:
        super().__init__(detail)
        if limit is not None:
            self.headers = {BODY_LIMIT_HEADER: str(limit)}


class UploadTooLarge(DomainError):
    """A whole upload sent in parts (a run document, a tensor's values) over its setting:
    smaller parts cannot help, the operator has to raise the setting."""

    status_code = 413
    code = "upload_too_large"


class UploadOffset(DomainError):
    """A part that does not continue an upload: its ``Upload-Offset`` header says where the
    server's bytes end, the offset the next part must start at."""

    status_code = 409
    code = "upload_offset"

    def __init__(self, detail: Any, *, received: int) -> None:
        super().__init__(detail)
        self.received = received
        self.headers = {"Upload-Offset": str(received)}


class StagingFull(DomainError):
    """A token holds as many bytes of unfinished uploads as it may: retry later."""

    status_code = 507
    code = "staging_full"


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
