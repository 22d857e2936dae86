"""The reads' heavy computations, bounded per process and per request (design §3.3.15).

Some answers need work that grows with what nodes uploaded: aligning two op traces,
comparing two results' tensors with their whole values (256 tensors a unit). Each such
unit is kept by content once computed (``comparisons``), so it runs once per content;
this module bounds how it runs until then:

- **one flight per key**: a second request for a unit being computed waits for that
  computation's answer instead of computing it again (45 readers of one new pair: one
  alignment);
- **a few at once** (``slots``): a unit waits for a slot, holding a worker thread but no
  database connection (the services release theirs before computing: ``kit.db.release``)
  and no CPU;
- **a deadline per request** (``seconds``): a request starts no new unit once it has
  computed for that long (it always computes its first), and what it did not compute
  is answered as pending: the next request goes on where it stopped, since what was
  computed is kept;
- **stopped with the server**: once the server stops (SIGTERM: ``serve`` gives requests a
  few seconds, then the app's lifespan ends), no unit starts and waiting ones give up,
  so the process ends within a unit's time (an alignment's work budget, a tensor's
  scan) rather than when every queued read is done.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import TypeVar

from numparity_server.kit.errors import ServiceUnavailable

T = TypeVar("T")

# How often a unit waiting for a slot looks whether the server stopped (seconds).
_POLL_S = 0.1


class Postponed(Exception):
    """A request's computing time is spent: the unit is left for a later request."""


@dataclass
class _Flight:
    done: threading.Event = field(default_factory=threading.Event)
    result: object = None
    error: BaseException | None = None


class Computations:
    """The process's gate for the reads' heavy units (module docstring)."""

    def __init__(self, *, slots: int = 2, seconds: float = 1.0) -> None:
        self.seconds = seconds
        self._slots = threading.BoundedSemaphore(slots)
        self._lock = threading.Lock()
        self._flights: dict[Hashable, _Flight] = {}
        self._stopped = threading.Event()
        self.computed = 0  # units computed (tests count them)

    def stop(self) -> None:
        self._stopped.set()

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()

    def request(self) -> Budget:
        """One request's budget: its units run through this gate until its deadline."""
        return Budget(self, time.monotonic() + self.seconds)

    def run(self, key: Hashable, compute: Callable[[], T]) -> T:
        """``compute()``, or the answer of the computation of ``key`` under way."""
        with self._lock:
            flight = self._flights.get(key)
            leader = flight is None
            if flight is None:
                flight = self._flights[key] = _Flight()
        if not leader:
            flight.done.wait()
            if flight.error is not None:
                raise flight.error
            return flight.result  # type: ignore[return-value]
        try:
            self._acquire()
            try:
                flight.result = compute()
                with self._lock:
                    self.computed += 1
            finally:
                self._slots.release()
        except BaseException as exc:
            flight.error = exc
            raise
        finally:
            with self._lock:
                del self._flights[key]
            flight.done.set()
        return flight.result  # type: ignore[return-value]

    def _acquire(self) -> None:
        while not self._slots.acquire(timeout=_POLL_S):
            if self.stopped:
                break
        if self.stopped:
            raise ServiceUnavailable("the server is stopping; ask another replica or again "
                                     "once it is back")


class Budget:
    """One request's units: each runs through the gate; once the deadline has passed, a
    new one raises ``Postponed`` (the first always runs, so every request makes
    progress)."""

    def __init__(self, gate: Computations | None, until: float) -> None:
        self.gate, self.until = gate, until
        self.started = 0
        self.postponed = 0

    def spent(self) -> bool:
        """Whether a new unit would be postponed (so its inputs need not be read)."""
        return bool(self.started) and time.monotonic() > self.until

    def run(self, key: Hashable, compute: Callable[[], T], *, always: bool = False) -> T:
        """``always``: a unit the answer cannot do without, run even once the deadline has
        passed (through the gate all the same)."""
        if self.spent() and not always:
            self.postponed += 1
            raise Postponed
        self.started += 1
        return compute() if self.gate is None else self.gate.run(key, compute)


def unbounded() -> Budget:
    """A budget without gate or deadline (the CLI, the demo's report, benchmarks)."""
    return Budget(None, float("inf"))
