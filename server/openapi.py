"""The OpenAPI schema, made to tell the truth (design §3.2, "Errors and the OpenAPI").

FastAPI documents what it can see: a route's 200 and, for a route with parameters, its
own ``HTTPValidationError``, which is not this server's error body. Every error here is
``{"error": code, "detail": ...}`` (``kit.handlers.ErrorBody``), and which statuses an
operation can answer follows from what the generated schema already says of it. So,
once, after every route is registered, the schema is corrected operation by operation
(a new route gets it for free):

- every error status of every operation has ``ErrorBody`` as its schema;
- a security requirement (the bearer token, ``deps.AuthorizationHeader``, on every route
  that checks one) adds 401 and 403; a path parameter 404; any parameter or body 422;
  a body 400 (not JSON at all), 408 (too slow, ``kit.limits``), 413 (too large), 415
  (an encoding other than gzip) and 429 (over the token's budget, ``kit.budget``); every
  operation but ``/healthz`` and ``/api/v1`` reads the database, so 503;
- ``limit`` (``deps.page_params``) and every ``*_limit`` (``deps.divergence_pages``) have
  the server's ``page_max`` as their maximum;
- every string a path or query parameter takes has the pattern ``^[^\\u0000]*$``: no value
  may hold a NUL (``deps``, app-wide: 404 in a path, 422 in a query);
- the models of hand-read bodies (the run document) are added to the components.

Read from the schema rather than from FastAPI's route objects, whose layout changes
between FastAPI versions.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel

from numparity_server.kit.handlers import ErrorBody

_REF = "#/components/schemas/{model}"
_ERROR_REF = {"$ref": _REF.format(model=ErrorBody.__name__)}

# What a status means when a route does not say more.
_DESCRIPTIONS = {
    400: "Bad request: the body could not be read",
    401: "Missing, malformed, unknown or revoked token (`WWW-Authenticate: Bearer`)",
    403: "The token's role may not do this",
    404: "Not found: `detail` names what is unknown",
    405: "Method not allowed",
    408: "The body did not arrive within NUMPARITY_BODY_TIMEOUT_S",
    409: "Conflict",
    413: "The body is over NUMPARITY_MAX_BODY_BYTES",
    415: "Unsupported media type or content encoding",
    429: "Over the token's byte budget (NUMPARITY_TOKEN_BYTES_PER_S); `Retry-After` says "
         "when to try again",
    422: "Invalid parameters or body: `detail` is a list of `{loc, msg}`, `loc` naming "
         "the parameter or field",
    503: "The database is unavailable (`Retry-After` says when to try again)",
}

# The operations that never touch the database (no 503).
_NO_DATABASE = frozenset({("get", "/healthz"), ("get", "/api/v1")})


def install(app: FastAPI, *, models: tuple[type[BaseModel], ...] = ()) -> None:
    """Replace ``app.openapi`` by the corrected schema (built once, on first request)."""
    default_openapi = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = default_openapi()
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for model in (ErrorBody, *models):
            definition = model.model_json_schema(by_alias=True, ref_template=_REF)
            components.update(definition.pop("$defs", {}))
            components[model.__name__] = definition
        page_max: int = app.state.settings.page_max
        for path, operations in schema.get("paths", {}).items():
            for method, operation in operations.items():
                _correct(operation, page_max, database=(method, path) not in _NO_DATABASE)
        for unused in ("HTTPValidationError", "ValidationError"):
            components.pop(unused, None)
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def _correct(operation: dict[str, Any], page_max: int, *, database: bool) -> None:
    parameters: list[dict[str, Any]] = operation.get("parameters", [])
    where = {(p["in"], p["name"].lower()) for p in parameters}
    statuses = {503} if database else set()
    if operation.get("security"):
        statuses.update((401, 403))
    if any(location == "path" for location, _ in where):
        statuses.add(404)
    if parameters or "requestBody" in operation:
        statuses.add(422)
    if "requestBody" in operation:
        # Not JSON at all or corrupt gzip; too slow (kit.limits); too large; an encoding
        # other than gzip.
        statuses.update((400, 408, 413, 415, 429))
    responses: dict[str, Any] = operation.setdefault("responses", {})
    for status in statuses:
        responses.setdefault(str(status), {})
    for code, response in responses.items():
        if code.isdigit() and int(code) >= 400:
            if response.get("description") in (None, "Validation Error"):  # FastAPI's own
                response["description"] = _DESCRIPTIONS.get(int(code), "Error")
            content = response.setdefault("content", {}).setdefault("application/json", {})
            content["schema"] = _ERROR_REF
    for parameter in parameters:
        if parameter["in"] in ("path", "query"):
            _forbid_nul(parameter.get("schema", {}))
    paginated = ("query", "limit") in where and ("query", "offset") in where
    for parameter in parameters:
        name = parameter["name"]
        if parameter["in"] == "query" and ((name == "limit" and paginated)
                                           or name.endswith("_limit")):
            _set_maximum(parameter["schema"], page_max)


# JSON Schema's regular expressions are ECMA 262: \u0000 is the NUL character.
_NO_NUL = "^[^\\u0000]*$"


def _forbid_nul(schema: dict[str, Any]) -> None:
    """A NUL-free ``pattern`` on every string branch of a parameter's schema, the items of
    a repeated parameter's too."""
    for branch in schema.get("anyOf", [schema]):
        if branch.get("type") == "string" and "pattern" not in branch:
            branch["pattern"] = _NO_NUL
        elif branch.get("type") == "array" and isinstance(branch.get("items"), dict):
            _forbid_nul(branch["items"])


def _set_maximum(schema: dict[str, Any], maximum: int) -> None:
    """``maximum`` on the integer branch of a parameter's schema (``int | None``)."""
    for branch in schema.get("anyOf", [schema]):
        if branch.get("type") == "integer":
            branch["maximum"] = maximum
