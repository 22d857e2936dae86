"""Plain log lines on stderr (cron-safe: no colours, no progress bars)."""

from __future__ import annotations

import sys
import time


def log(message: str) -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime())
    print(f"{stamp} numparity-agent: {message}", file=sys.stderr, flush=True)
