"""What one token may send: a byte budget per token, so no token takes the server from the
others (design §3.2, "Limits").

A token bucket per token: it holds up to ``burst`` bytes and refills at ``rate`` bytes a
second. A request with a body costs its size, and at least ``MIN_REQUEST_COST`` (a flood
of small documents costs its validation too); one that the bucket cannot pay is refused
with 429 and a ``Retry-After`` saying when it could be, before its body is read when its
``Content-Length`` says the size. A gzip body then pays what it decompresses to beyond
that, before it is parsed (``kit.limits.charge_decoded``): the server works on and
stores the decompressed bytes, so those are what a token spends. The agent keeps a
refused run in its spool and retries after that time (design §2.8), so throttling delays
runs, never loses them.

The key is the sha256 of the token as authentication reads it (``kit.bearer``: the scheme
in any case, spaces around), so every spelling of one header is one bucket: no database
look-up (the token is checked later, once the body is in), and a header that is not a
valid token still pays for what it sends (malformed headers all share one bucket). The
buckets live in the worker process: with ``--workers N`` a token may send up to N times
the rate. A bucket that has refilled is the same as none, so full buckets are
dropped and the table stays as large as the number of tokens recently over their burst.
"""

from __future__ import annotations

import hashlib
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from numparity_server.kit.bearer import bearer_token

# What a request with a body costs at least: a run document of a known environment is a
# few KiB, so this is a few runs' worth; 100 spooled runs flushed at once cost 6.4 MiB.
MIN_REQUEST_COST = 64 * 1024
# Buckets kept at most; past it the fullest half is dropped (they are the least in debt).
MAX_BUCKETS = 100_000


@dataclass
class _Bucket:
    level: float  # bytes available
    at: float  # when ``level`` was read (monotonic seconds)


class TokenBudget:
    """Byte budgets per key; ``rate`` 0 turns them off."""

    def __init__(self, *, rate: float, burst: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.burst = burst
        self.clock = clock
        self._buckets: dict[bytes, _Bucket] = {}
        # The event loop spends bodies' sizes; worker threads spend what gzip decoded to.
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """How many tokens are in debt (have a bucket that is not full)."""
        return len(self._buckets)

    @property
    def enabled(self) -> bool:
        return self.rate > 0

    def spend(self, key: bytes, size: int, *, least: int = MIN_REQUEST_COST) -> float:
        """Take the cost of a ``size``-byte body (at least ``least``) from ``key``'s
        bucket: 0.0 when paid, else the seconds until it could be (nothing is taken
        then)."""
        if not self.enabled:
            return 0.0
        with self._lock:
            return self._spend(key, min(max(size, least), self.burst))

    def _spend(self, key: bytes, cost: float) -> float:
        now = self.clock()
        bucket = self._buckets.get(key)
        level = self.burst if bucket is None else min(
            self.burst, bucket.level + (now - bucket.at) * self.rate)
        if level < cost:
            return (cost - level) / self.rate
        level -= cost
        if level >= self.burst:
            self._buckets.pop(key, None)
        else:
            self._buckets[key] = _Bucket(level, now)
            if len(self._buckets) > MAX_BUCKETS:
                self._prune(now)
        return 0.0

    def _prune(self, now: float) -> None:
        """Drop full buckets, then the fullest half if that is not enough."""
        levels = {key: bucket.level + (now - bucket.at) * self.rate
                  for key, bucket in self._buckets.items()}
        keep = sorted((key for key, level in levels.items() if level < self.burst),
                      key=levels.__getitem__)[: MAX_BUCKETS // 2]
        self._buckets = {key: self._buckets[key] for key in keep}


def budget_key(authorization: bytes | None) -> bytes:
    """The bucket of a request: the sha256 of its bearer token (one bucket for requests
    without one or with a malformed header)."""
    token = bearer_token(authorization.decode("latin-1")) if authorization else None
    return hashlib.sha256(token.encode("latin-1") if token else b"").digest()


def retry_after(seconds: float) -> str:
    """``Retry-After`` in whole seconds, at least 1."""
    return str(max(1, math.ceil(seconds)))
