"""The one place errors become HTTP responses: ``{"error": code, "detail": ...}``."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field
from sqlalchemy import exc as sa_exc
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from numparity_server.kit.errors import DomainError

log = logging.getLogger("numparity_server")

# Seconds a client should wait before retrying when the database is out of reach.
RETRY_AFTER_S = 5

# The database cannot be reached or answered with a transient failure: refused or lost
# connections, a dropped database, the pool exhausted, SQLite's busy timeout. A client
# should retry later (the agent keeps the run in its spool), so 503, never 500.
DATABASE_UNAVAILABLE = (sa_exc.OperationalError, sa_exc.InterfaceError, sa_exc.TimeoutError,
                        sa_exc.DisconnectionError)


class ErrorLocation(BaseModel):
    """One invalid parameter or field: where (``["query", "limit"]``, ``["body",
    "results", 0, "status"]``) and what is wrong."""

    loc: list[str | int]
    msg: str


class ErrorBody(BaseModel):
    """Every error this server answers in JSON (the OpenAPI schema of every error status)."""

    error: str = Field(description="A stable code: validation_error, not_found, "
                                   "unauthorized, database_unavailable, ...",
                       examples=["not_found"])
    detail: str | list[ErrorLocation] = Field(
        description="A message naming the problem; for 422 (validation_error), the list of "
                    "invalid parameters or fields")


def validation_details(errors: Sequence[Any]) -> list[dict[str, Any]]:
    """Pydantic/FastAPI errors → ``[{"loc": [...], "msg": ...}]`` (loc names the field)."""
    return [{"loc": list(e.get("loc", ())), "msg": str(e.get("msg", ""))} for e in errors]


def error_response(status_code: int, code: str, detail: Any,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": code, "detail": detail}, status_code=status_code,
                        headers=headers)


_HTTP_CODES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
               405: "method_not_allowed", 408: "request_timeout", 409: "conflict",
               413: "payload_too_large", 415: "unsupported_media_type",
               422: "validation_error", 429: "too_many_requests", 503: "unavailable"}


def allowed_methods(request: Request) -> list[str]:
    """Every method some route answers at this path. Starlette's 405 names only the
    methods of the first route that matched the path, and GET and POST of one path
    (``/api/v1/runs``, ``/login``) are two routes."""
    return [method for method in _METHODS
            if any(route.matches({**request.scope, "method": method})[0] is Match.FULL
                   for route in request.app.router.routes)]


_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


# A page's error as HTML: (request) -> whether it asked for a page, and the renderer.
PageErrors = tuple[Callable[[Request], bool], Callable[[Request, int, Any], Response]]


def install_error_handlers(app: FastAPI, pages: PageErrors | None = None) -> None:
    """JSON errors for the API; with ``pages``, the same errors as HTML for the pages."""

    def respond(request: Request, status_code: int, code: str, detail: Any,
                headers: dict[str, str] | None = None) -> Response:
        if pages is not None and pages[0](request):
            response = pages[1](request, status_code, detail)
            response.headers.update(headers or {})
            return response
        return error_response(status_code, code, detail, headers)

    async def on_domain_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, DomainError)
        return respond(request, exc.status_code, exc.code, exc.detail, exc.response_headers())

    async def on_validation_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        errors = validation_details(exc.errors())
        if pages is not None and pages[0](request):
            # The page names the value it could not read.
            errors = [{**detail, "input": error.get("input")}
                      for detail, error in zip(errors, exc.errors(), strict=True)]
        return respond(request, 422, "validation_error", errors)

    async def on_http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        code = _HTTP_CODES.get(exc.status_code, "error")
        headers = getattr(exc, "headers", None)
        allowed = allowed_methods(request) if exc.status_code == 405 else []
        if allowed:
            headers = {**(headers or {}), "Allow": ", ".join(allowed)}
        return respond(request, exc.status_code, code, exc.detail, headers)

    async def on_database_unavailable(request: Request, exc: Exception) -> Response:
        cause = getattr(exc, "orig", None) or exc
        first_line = next(iter(str(cause).splitlines()), "")
        log.warning("database unavailable during %s %s: %s: %s", request.method,
                    request.url.path, type(cause).__name__, first_line)
        return respond(
            request, 503, "database_unavailable",
            f"the database is unavailable ({type(cause).__name__}); retry later",
            {"Retry-After": str(RETRY_AFTER_S)},
        )

    app.add_exception_handler(DomainError, on_domain_error)
    for error in DATABASE_UNAVAILABLE:
        app.add_exception_handler(error, on_database_unavailable)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
