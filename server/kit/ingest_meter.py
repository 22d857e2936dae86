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
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Histogram, values
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

# The label is called "outcome" on the wire (dashboards query it); in code, the answer.
ANSWERS = ("created", "replayed", "rejected", "error")
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
for _answer in ANSWERS:  # every answer from the start, so rate() sees its first one
    RUNS_INGESTED.labels(_answer)
INGEST_DURATION = Histogram(
    "numparity_ingest_duration_seconds",
    "Time the server took to answer POST /api/v1/runs (every outcome), in seconds.",
    buckets=DURATION_BUCKETS, registry=REGISTRY,
)


@dataclass
class IngestMeter:
    """What the route tells the meter: the run was stored (``created``) or replayed. The
    dependency that times each upload lives with the others in ``deps.py``."""

    answer: str | None = None
    started: float = field(default_factory=time.perf_counter)

    def stored(self, *, created: bool) -> None:
        self.answer = "created" if created else "replayed"

    def failed(self, status: object) -> None:
        """A refusal (4xx) or an error (anything else, e.g. the database unavailable)."""
        self.answer = "rejected" if isinstance(status, int) and 400 <= status < 500 else "error"

    def record(self) -> None:
        INGEST_DURATION.observe(time.perf_counter() - self.started)
        RUNS_INGESTED.labels(self.answer or "error").inc()


def multiprocess() -> bool:
    """Whether this process's metrics live in PROMETHEUS_MULTIPROC_DIR's files (decided by
    prometheus_client when it was imported)."""
    return values.ValueClass is not values.MutexValue


def process_metrics() -> Collector:
    """This process's metrics or, in multiprocess mode, the sum over every process."""
    if multiprocess():
        return MultiProcessCollector(None, path=os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
    return REGISTRY
