"""Where a variant's time goes (design §2.7, `timeline`): seconds per phase.

A result's `timeline` holds its workload's phases (build, run, fingerprint, trace,
every repeat added up); the document's `timeline` has one entry per variant child
process with that process's phases: `start` (from the parent's spawn to the child's
first line), `import` (torch and the agent), `device_init` (the device's runtime and
context: CUDA's initialisation, one allocation and a synchronisation), `environment`
(the environment document, once per run), the workloads' `build`, `run`,
`fingerprint` and `trace` added up, `write` (the child's answer written, the process
gone and the answer read by the parent) and `other` (what none of them counts: knobs
applied, workloads loaded, each workload's warm-up evaluation, progress written).
This module does not import torch.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

# The phases, in the order a child goes through them.
PHASES = ("start", "import", "device_init", "environment", "build", "run", "fingerprint",
          "trace", "write", "other")
# Per workload, the phases a result's `timeline` may have.
WORKLOAD_PHASES = ("build", "run", "fingerprint", "trace")


class PhaseClock:
    """Seconds spent in each named phase, added up over every time it is entered."""

    def __init__(self) -> None:
        self._seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - start)

    def add(self, name: str, seconds: float) -> None:
        self._seconds[name] = self._seconds.get(name, 0.0) + max(seconds, 0.0)

    def merge(self, timeline: dict[str, float]) -> None:
        """Add a `seconds()` map (a result's timeline into its child's)."""
        for key, value in timeline.items():
            self.add(key.removesuffix("_s"), value)

    def seconds(self) -> dict[str, float]:
        """`{"<phase>_s": seconds}` in PHASES order (6 decimals), the wire form."""
        order = {name: i for i, name in enumerate(PHASES)}
        return {f"{name}_s": round(value, 6) for name, value in
                sorted(self._seconds.items(), key=lambda kv: order.get(kv[0], len(order)))}
