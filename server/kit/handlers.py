"""The one place errors become HTTP responses: ``{"error": code, "detail": ...}``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from numparity_server.kit.errors import DomainError


def validation_details(errors: Sequence[Any]) -> list[dict[str, Any]]:
    """Pydantic/FastAPI errors → ``[{"loc": [...], "msg": ...}]`` (loc names the field)."""
    return [{"loc": list(e.get("loc", ())), "msg": str(e.get("msg", ""))} for e in errors]


def error_response(status_code: int, code: str, detail: Any,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": code, "detail": detail}, status_code=status_code,
                        headers=headers)


_HTTP_CODES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
               405: "method_not_allowed", 409: "conflict", 413: "payload_too_large",
               415: "unsupported_media_type", 422: "validation_error", 503: "unavailable"}


def install_error_handlers(app: FastAPI) -> None:
    async def on_domain_error(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, DomainError)
        return error_response(exc.status_code, exc.code, exc.detail, exc.headers)

    async def on_validation_error(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return error_response(422, "validation_error", validation_details(exc.errors()))

    async def on_http_error(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        code = _HTTP_CODES.get(exc.status_code, "error")
        return error_response(exc.status_code, code, exc.detail, getattr(exc, "headers", None))

    app.add_exception_handler(DomainError, on_domain_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
