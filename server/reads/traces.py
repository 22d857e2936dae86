"""Stored op traces as the pure analysis sees them (design §2.7): the bodies
decompressed and parsed, in one batch per request. The last few parsed are kept (a trace
is content: it never changes): /divergence aligns its baseline's trace with each other
group's, and a 50,000-op trace takes ~0.3 s to parse."""

from __future__ import annotations

import threading
import zlib
from collections import OrderedDict
from collections.abc import Iterable

import orjson
from sqlalchemy import select
from sqlalchemy.orm import Session

from numparity_server import analysis
from numparity_server.kit.db import chunked
from numparity_server.models import Trace

# Parsed traces kept per process (a 50,000-op trace holds ~20 MB parsed).
KEPT_TRACES = 4
_kept: OrderedDict[str, analysis.Trace] = OrderedDict()
_lock = threading.Lock()


def load_traces(session: Session, hashes: Iterable[str]) -> dict[str, analysis.Trace]:
    """Hash -> trace of every stored hash among ``hashes`` (unknown ones absent)."""
    traces: dict[str, analysis.Trace] = {}
    wanted = set(hashes)
    with _lock:
        for digest in wanted & _kept.keys():
            traces[digest] = _kept[digest]
            _kept.move_to_end(digest)
    for part in chunked(sorted(wanted - traces.keys())):
        for digest, body in session.execute(
                select(Trace.hash, Trace.body).where(Trace.hash.in_(part))):
            traces[digest] = analysis.trace_from_body(orjson.loads(zlib.decompress(body)),
                                                      digest)
            with _lock:
                _kept[digest] = traces[digest]
                while len(_kept) > KEPT_TRACES:
                    _kept.popitem(last=False)
    return traces
