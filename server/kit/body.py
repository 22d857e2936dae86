"""Request bodies read by hand: gzip within the size limit, then bounded JSON.

The agent's routes read their body themselves (instead of letting FastAPI parse it) so
that gzip is accepted, the document can be hashed as received, and the parse and its
checks run on a worker thread (``run_in_threadpool``), never on the event loop: a body
of millions of values takes a worker for a moment, not the whole process. The size limit
and the deadline of the body are ``kit.limits``'.
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Callable
from typing import Any

import orjson

from numparity_server.kit.errors import (
    BadRequest,
    DomainError,
    InvalidDocument,
    PayloadTooLarge,
    UnsupportedMediaType,
)


def _too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"request body exceeds the limit of {limit} bytes "
                           "(setting NUMPARITY_MAX_BODY_BYTES)", limit=limit)


def decode_body(body: bytes, *, encoding: str | None, limit: int,
                too_large: Callable[[int], DomainError] = _too_large,
                charge: Callable[[int], None] | None = None) -> bytes:
    """The body, decoded from gzip when ``Content-Encoding: gzip``; ``too_large(limit)``
    (a 413) past ``limit``. ``charge`` is told the decoded size before anything reads it
    (the token's budget pays decompressed bytes: ``kit.limits.charge_decoded``).

    The body arrives whole and within the limit (``kit.limits.BodyLimits``); this bounds
    what gzip makes of it. One gzip member only: anything after its end, another member
    included, is a 400 (the agent sends one member; bytes that would be silently dropped
    are a broken client's, and a second member would only be a way round the check).
    """
    encoding = (encoding or "identity").strip().lower()
    if encoding in ("", "identity"):
        return body
    decoded = _gunzip(body, encoding, limit, too_large)
    if charge is not None:
        charge(len(decoded))
    return decoded


def _gunzip(body: bytes, encoding: str, limit: int,
            too_large: Callable[[int], DomainError]) -> bytes:
    if encoding not in ("gzip", "x-gzip"):
        raise UnsupportedMediaType(f"unsupported Content-Encoding {encoding!r}; use gzip")
    # Bounded decompression: a small gzip bomb must not expand past the limit in memory.
    decompressor = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        decoded = decompressor.decompress(body, limit + 1)
        if len(decoded) > limit or decompressor.unconsumed_tail:
            raise too_large(limit)
        decoded += decompressor.flush()
    except zlib.error as exc:
        raise BadRequest(f"request body is not valid gzip: {exc}") from None
    if len(decoded) > limit:
        raise too_large(limit)
    if not decompressor.eof:
        raise BadRequest("request body is truncated gzip")
    if decompressor.unused_data:
        raise BadRequest(f"request body has {len(decompressor.unused_data)} bytes of trailing "
                         "data after the gzip stream (send one gzip member and nothing after)")
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

# Bounds of any JSON body. The agent's documents nest 7 levels deep; a run of ~400 full
# fingerprints holds ~20,000 values, and 32 MiB of bare references ~1.3 million.
MAX_JSON_DEPTH = 64
MAX_JSON_VALUES = 2_000_000


def parse_json_object(body: bytes) -> dict[str, Any]:
    """A JSON object; anything else (including NaN/Infinity literals) is a 422.

    orjson reads well-formed documents (it is strict: no NaN, no Infinity, no number
    beyond float64, no lone surrogate) several times faster than the standard library,
    whose float hook runs once per number; whatever orjson refuses is read again by the
    standard library, which says precisely what is wrong and where. orjson reads an
    integer beyond 64 bits as a float: typed fields then refuse it (they are bounded),
    and in the free-form environment and knobs it is kept as that float.
    """
    # A parser holds the GIL for the whole parse (a second for 6 million values), on
    # whichever thread: so a body whose commas alone pass the bound is refused unread.
    if body.count(b",") >= MAX_JSON_VALUES:
        raise _too_many_values()
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError:
        document = _parse_slowly(body)
    if not isinstance(document, dict):
        raise InvalidDocument.at(["body"], "the body must be a JSON object")
    check_bounds(document, strings=_SUSPECT_ESCAPE.search(body) is not None)
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


def check_bounds(document: dict[str, Any], *, strings: bool) -> None:
    """422 past ``MAX_JSON_DEPTH`` levels or ``MAX_JSON_VALUES`` values, or (``strings``:
    the body holds a suspect escape) naming the first string or key with a NUL or a lone
    surrogate.

    One walk over the containers; a container's values are counted by its length before
    they are looked at, so a body of millions of values is refused before it is walked.
    The depth bound keeps every later step (canonical JSON, the database's JSON) in its
    range. Where a container sits is a chain of (parent, key) pairs, made into a ``loc``
    only for the error: the walk costs ~1 ms a MiB of fingerprints.
    """
    stack: list[tuple[Any, int, _Trail]] = [(document, 1, None)]
    values = 1
    while stack:
        value, depth, trail = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise InvalidDocument.at(_loc(trail)[:8],
                                     f"nested deeper than {MAX_JSON_DEPTH} levels")
        values += len(value)
        if values > MAX_JSON_VALUES:
            raise _too_many_values()
        items = value.items() if type(value) is dict else enumerate(value)
        for key, item in items:
            kind = type(item)
            if kind is dict or kind is list:
                stack.append((item, depth + 1, (trail, key)))
            elif strings and kind is str and (problem := _string_problem(item)):
                raise InvalidDocument.at(_loc((trail, key)), problem)
        if strings and type(value) is dict:
            for key in value:
                if problem := _string_problem(key):
                    raise InvalidDocument.at(_loc((trail, key)), problem)


# Where a container sits: (the parent's trail, its key in the parent); None is the body.
_Trail = tuple[Any, "str | int"] | None


def _loc(trail: _Trail) -> list[str | int]:
    keys: list[str | int] = []
    while trail is not None:
        trail, key = trail
        keys.append(_printable(key))
    return ["body", *reversed(keys)]


def _too_many_values() -> InvalidDocument:
    return InvalidDocument.at(["body"], f"the body holds more than {MAX_JSON_VALUES:,} "
                                        "JSON values")


def _string_problem(text: str) -> str | None:
    if "\x00" in text:
        return "strings must not contain NUL (\\u0000)"
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return "strings must not contain a lone UTF-16 surrogate"
    return None


def _printable(key: str | int) -> str | int:
    """A key as the error can name it: a lone surrogate, which no UTF-8 answer can carry,
    written as its escape."""
    if isinstance(key, str):
        return key.encode("utf-8", "backslashreplace").decode("utf-8")
    return key
