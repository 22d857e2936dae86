"""Stored op traces as the pure analysis sees them (design §2.7): the bodies
decompressed and parsed, in one batch per request."""

from __future__ import annotations

import zlib
from collections.abc import Iterable

import orjson
from sqlalchemy import select
from sqlalchemy.orm import Session

from numparity_server import analysis
from numparity_server.kit.db import chunked
from numparity_server.models import Trace


def load_traces(session: Session, hashes: Iterable[str]) -> dict[str, analysis.Trace]:
    """Hash -> trace of every stored hash among ``hashes`` (unknown ones absent)."""
    traces: dict[str, analysis.Trace] = {}
    for part in chunked(sorted(set(hashes))):
        for digest, body in session.execute(
                select(Trace.hash, Trace.body).where(Trace.hash.in_(part))):
            traces[digest] = analysis.trace_from_body(orjson.loads(zlib.decompress(body)),
                                                      digest)
    return traces
