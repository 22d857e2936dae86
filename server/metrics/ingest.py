"""Process metrics of the ingest path: uploads by outcome and how long each took.

They are created once per process, at import, in a registry of their own rather than
prometheus_client's global one, so every app built in the process (tests build many)
records into the same two metrics and nothing else leaks into ``/metrics``.

Several server processes (``numparity-server serve --workers N``): when
``PROMETHEUS_MULTIPROC_DIR`` is set before prometheus_client is first imported (``serve``
sets it), each process writes its values to files there and a scrape of any process
reports the sum over all of them.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends
from prometheus_client import CollectorRegistry, Counter, Histogram, values
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

OUTCOMES = ("created", "replayed", "rejected", "error")
# From a known run on a known environment (~10 ms) to a new environment's 1.7 MiB.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

REGISTRY = CollectorRegistry()
RUNS_INGESTED = Counter(
    "numparity_runs_ingested",
    "Answers to POST /api/v1/runs by outcome: created (201), replayed (200, the same "
    "document again), rejected (4xx: invalid document, conflict, too large, bad token), "
    "error (5xx, e.g. the database unavailable).",
    ["outcome"], registry=REGISTRY,
)
for _outcome in OUTCOMES:  # every outcome from the start, so rate() sees its first one
    RUNS_INGESTED.labels(_outcome)
INGEST_DURATION = Histogram(
    "numparity_ingest_duration_seconds",
    "Time the server took to answer POST /api/v1/runs (every outcome), in seconds.",
    buckets=DURATION_BUCKETS, registry=REGISTRY,
)


@dataclass
class IngestMeter:
    """What the route tells the meter: the run was stored (``created``) or replayed."""

    outcome: str | None = None

    def stored(self, *, created: bool) -> None:
        self.outcome = "created" if created else "replayed"


async def meter_ingest() -> AsyncIterator[IngestMeter]:
    """Times one upload and counts its outcome.

    A dependency with ``yield`` rather than a block in the route: declared before the
    route's other dependencies, it also sees what they raise (a missing or wrong agent
    token), which the agent treats like any other refusal (a 4xx: the run is moved aside).
    Its exit runs as the answer goes out (FastAPI's request scope), so a scrape may see
    an upload a moment after its client got the answer.
    """
    meter = IngestMeter()
    start = time.perf_counter()
    try:
        yield meter
    except BaseException as exc:
        # DomainError and HTTPException carry their status; anything else is a 5xx.
        status = getattr(exc, "status_code", 500)
        meter.outcome = "rejected" if isinstance(status, int) and 400 <= status < 500 else "error"
        raise
    finally:
        INGEST_DURATION.observe(time.perf_counter() - start)
        RUNS_INGESTED.labels(meter.outcome or "error").inc()


MeteredIngest = Annotated[IngestMeter, Depends(meter_ingest)]


def multiprocess() -> bool:
    """Whether this process's metrics live in PROMETHEUS_MULTIPROC_DIR's files (decided by
    prometheus_client when it was imported)."""
    return values.ValueClass is not values.MutexValue


def process_metrics() -> Collector:
    """This process's metrics or, in multiprocess mode, the sum over every process."""
    if multiprocess():
        return MultiProcessCollector(None, path=os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
    return REGISTRY
