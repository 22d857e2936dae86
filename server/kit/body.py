"""Request bodies read by hand: size limit before and after gzip, then JSON.

The run upload reads its body itself (instead of letting FastAPI parse it) so that an
oversized body is refused while streaming, gzip is accepted, and the document can be
hashed as received.
"""

from __future__ import annotations

import json
import re
import zlib
from typing import Any

import orjson
from fastapi import Request

from numparity_server.kit.errors import (
    BadRequest,
    InvalidDocument,
    PayloadTooLarge,
    UnsupportedMediaType,
)


def _too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"request body exceeds the limit of {limit} bytes "
                           "(setting NUMPARITY_MAX_BODY_BYTES)")


async def read_body(request: Request, *, limit: int) -> bytes:
    """The body, decoded from gzip when ``Content-Encoding: gzip``; 413 past ``limit``."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    chunks: list[bytes] = []
    received = 0
    async for chunk in request.stream():
        received += len(chunk)
        if received > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    body = b"".join(chunks)

    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding not in ("gzip", "x-gzip"):
        raise UnsupportedMediaType(f"unsupported Content-Encoding {encoding!r}; use gzip")
    # Bounded decompression: a small gzip bomb must not expand past the limit in memory.
    decompressor = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        decoded = decompressor.decompress(body, limit + 1)
        if len(decoded) > limit or decompressor.unconsumed_tail:
            raise _too_large(limit)
        decoded += decompressor.flush()
    except zlib.error as exc:
        raise BadRequest(f"request body is not valid gzip: {exc}") from None
    if len(decoded) > limit:
        raise _too_large(limit)
    if not decompressor.eof:
        raise BadRequest("request body is truncated gzip")
    return decoded


class _NotJson(ValueError):
    """A literal Python's json reads but JSON does not have (NaN, Infinity, 1e400)."""


def _reject_constant(literal: str) -> float:
    raise _NotJson(f"{literal} is not valid JSON (JSON has no NaN or Infinity; the agent "
                   "sends arrays as base64 and non-finite statistics as null)")


def _finite_float(literal: str) -> float:
    value = float(literal)
    if value != value or value in (float("inf"), float("-inf")):
        raise _NotJson(f"the number {literal[:40]} does not fit a float64")
    return value


# A NUL or a lone surrogate can only reach a JSON string as an escape (\u0000, \ud800);
# PostgreSQL text refuses both and UTF-8 cannot encode a surrogate. Looking for the escape
# in the raw body is cheap; only when one is there is the parsed document walked.
_SUSPECT_ESCAPE = re.compile(rb"\\u(?:0000|[dD][89a-fA-F])")


def parse_json_object(body: bytes) -> dict[str, Any]:
    """A JSON object; anything else (including NaN/Infinity literals) is a 422.

    orjson reads well-formed documents (it is strict: no NaN, no Infinity, no number
    beyond float64, no lone surrogate) several times faster than the standard library,
    whose float hook runs once per number; whatever orjson refuses is read again by the
    standard library, which says precisely what is wrong and where. orjson reads an
    integer beyond 64 bits as a float: typed fields then refuse it (they are bounded),
    and in the free-form environment and knobs it is kept as that float.
    """
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError:
        document = _parse_slowly(body)
    if not isinstance(document, dict):
        raise InvalidDocument.at(["body"], "the body must be a JSON object")
    if _SUSPECT_ESCAPE.search(body):
        _check_strings(document)
    return document


def _parse_slowly(body: bytes) -> Any:
    try:
        return json.loads(body, parse_constant=_reject_constant, parse_float=_finite_float)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidDocument.at(["body"], f"invalid JSON: {exc}") from None
    except _NotJson as exc:
        raise InvalidDocument.at(["body"], f"invalid JSON: {exc}") from None
    except RecursionError:
        raise InvalidDocument.at(["body"], "invalid JSON: nested too deeply") from None


def _check_strings(document: dict[str, Any]) -> None:
    """422 naming the first string (or key) holding a NUL or a lone surrogate."""
    stack: list[tuple[list[str | int], Any]] = [(["body"], document)]
    while stack:
        loc, value = stack.pop()
        if isinstance(value, dict):
            for key, item in value.items():
                _check_string([*loc, key], key)
                stack.append(([*loc, key], item))
        elif isinstance(value, list):
            stack.extend(([*loc, i], item) for i, item in enumerate(value))
        elif isinstance(value, str):
            _check_string(loc, value)


def _check_string(loc: list[str | int], text: str) -> None:
    if "\x00" in text:
        raise InvalidDocument.at(loc, "strings must not contain NUL (\\u0000)")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidDocument.at(loc, "strings must not contain a lone UTF-16 surrogate") from None
