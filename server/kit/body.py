"""Request bodies read by hand: size limit before and after gzip, then JSON.

The run upload reads its body itself (instead of letting FastAPI parse it) so that an
oversized body is refused while streaming, gzip is accepted, and the document can be
hashed as received.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

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


def parse_json_object(body: bytes) -> dict[str, Any]:
    try:
        document = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidDocument.at(["body"], f"invalid JSON: {exc}") from None
    if not isinstance(document, dict):
        raise InvalidDocument.at(["body"], "the body must be a JSON object")
    return document
