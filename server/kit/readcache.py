"""Answers of the fleet-wide reads, kept against the fleet's version (design §3.2,
"Reads follow writes").

`/audit`, `/divergence`, the fleet page and the workload page read every node's latest
results: at 100,000 nodes that is the cost of a view, and most views of a dashboard ask
what the last one asked while nothing was uploaded. So each process keeps, per question
(the route and its parameters), the last answer with the **version** it was computed at:
`reads.fleet_version` — a counter every write those reads depend on advances in its own
transaction, so it changes when that write commits, on every replica. A question asked
again at the same version is a lookup.

Two knobs bound what a lab gets for it:

- ``fresh_s`` (``read_cache_seconds``, default 0): how long an answer may still be served
  after a newer upload. 0 means never: every answer is as of the newest upload. A large
  fleet uploads many runs a second, so with 0 a busy dashboard recomputes on most views;
  a few seconds bound that to one computation per question per few seconds.
- ``max_age_s`` (60 s): an answer older than this is computed again even when nothing was
  uploaded — the audit's "stale node" moves with the clock.

Concurrent askers of one question whose answer is missing or too old wait for one
computation (single flight) instead of each doing it. Entries are per process (a
`--workers N` server keeps N copies) and at most ``max_entries`` (least recently used
first out).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")
Version = tuple[int, ...]


@dataclass
class _Entry:
    version: Version
    computed_at: float  # monotonic
    value: Any


@dataclass(frozen=True)
class Cached:
    """An answer and how old it is (seconds since it was computed): the HTTP `Age`."""

    value: Any
    age_s: float
    hit: bool


class ReadCache:
    def __init__(self, *, fresh_s: float = 0.0, max_age_s: float = 60.0,
                 max_entries: int = 256,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.fresh_s, self.max_age_s, self.max_entries = fresh_s, max_age_s, max_entries
        self._clock = clock
        self._entries: OrderedDict[Hashable, _Entry] = OrderedDict()
        self._lock = threading.Lock()
        self._computing: dict[Hashable, threading.Lock] = {}

    def get(self, key: Hashable, version: Version, compute: Callable[[], T],
            keep: Callable[[T], bool] | None = None) -> Cached:
        """The answer to `key` at `version`: kept, or computed once by whoever asks first.
        An answer ``keep`` refuses (one with comparisons still pending) is not kept."""
        found = self._usable(key, version)
        if found is not None:
            return found
        with self._lock:
            gate = self._computing.setdefault(key, threading.Lock())
        with gate:
            found = self._usable(key, version)  # another asker computed it meanwhile
            if found is not None:
                return found
            value = compute()
            with self._lock:
                if keep is not None and not keep(value):
                    self._computing.pop(key, None)
                    return Cached(value, 0.0, hit=False)
                self._entries[key] = _Entry(version, self._clock(), value)
                self._entries.move_to_end(key)
                while len(self._entries) > self.max_entries:
                    self._entries.popitem(last=False)
                self._computing.pop(key, None)
            return Cached(value, 0.0, hit=False)

    def _usable(self, key: Hashable, version: Version) -> Cached | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            age = self._clock() - entry.computed_at
            if age >= self.max_age_s:
                return None
            current = all(kept >= asked for kept, asked in zip(entry.version, version,
                                                               strict=True))
            if not current and age >= self.fresh_s:
                return None
            self._entries.move_to_end(key)
            return Cached(entry.value, age, hit=True)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
