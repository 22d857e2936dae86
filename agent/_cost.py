"""What determinism costs, with an uncertainty that means something (design §2.13).

The cost study runs the workload in rounds; each round runs every mode (`default`,
`strict`, `selective`) once, back to back, in an order that rotates from round to round,
so a burst of load on the node falls on all of a round's modes alike. A mode's cost is
the median over rounds of its *paired* ratio (its time over `default`'s in the same
round), and its uncertainty a bootstrap confidence interval of that median
(`paired_ratio`: CONFIDENCE, RESAMPLES resamples of the rounds, numpy). Rounds go on
until every mode's interval is narrow enough (`narrow`) or the time budget ends.

A figure is stated only when it means something (`verdict`): `measured` when the
interval is narrower than the effect (its distance from 1: "+x % [lo, hi]");
`negligible` when it is not, but within ± NEGLIGIBLE of no cost; otherwise `noisy`:
"not measurable on this node now", with the load that made it so, never a number whose
interval exceeds it. The server's audit says the same of the same figures
(`numparity_server.analysis.nondeterminism`), which mirrors `verdict` and `words`.
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

CONFIDENCE = 0.95
RESAMPLES = 2000
# A mode's interval is narrow enough once its half-width is within this of no cost, or
# within NARROW_OF_EFFECT of the effect: a 2x cost need not be known to the percent.
NARROW = 0.03
NARROW_OF_EFFECT = 0.1
# An interval within this of 1 that is wider than its effect says "no cost above ±h %".
NEGLIGIBLE = 0.05
# Timed rounds a study runs at least (after its warm-up), and at most.
MIN_TIMED = 5
MAX_ROUNDS = 64
# The study's time budget when the run gives none.
BUDGET_S = 60.0


def paired_ratio(default: list[float], other: list[float], *, seed: int = 0
                 ) -> dict[str, float]:
    """The median of other/default round by round, and the CONFIDENCE bootstrap
    (percentile) interval of that median: {"ratio", "ratio_low", "ratio_high"}."""
    base = np.asarray(default, dtype=np.float64)
    ratios = np.asarray(other, dtype=np.float64) / np.where(base > 0, base, np.nan)
    ratios = ratios[np.isfinite(ratios)]
    if ratios.size == 0:
        return {}
    median = float(np.median(ratios))
    if ratios.size == 1:
        return {"ratio": median, "ratio_low": median, "ratio_high": median}
    # A fixed seed: the same rounds always give the same interval.
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, ratios.size, size=(RESAMPLES, ratios.size))
    medians = np.median(ratios[picks], axis=1)
    tail = (1 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(medians, [tail, 100 - tail])
    return {"ratio": median, "ratio_low": float(min(low, median)),
            "ratio_high": float(max(high, median))}


def half_width(found: dict[str, Any]) -> float | None:
    """The larger distance from the ratio to its interval's ends (None: no interval)."""
    if found.get("ratio") is None or found.get("ratio_low") is None \
            or found.get("ratio_high") is None:
        return None
    return max(found["ratio"] - found["ratio_low"], found["ratio_high"] - found["ratio"])


def narrow(found: dict[str, Any], timed: int) -> bool:
    """Whether a mode's interval is narrow enough to stop timing rounds."""
    half = half_width(found)
    if half is None or timed < MIN_TIMED:
        return False
    return half <= max(NARROW, NARROW_OF_EFFECT * abs(found["ratio"] - 1))


def verdict(ratio: float | None, half: float | None) -> str:
    """`measured`, `negligible` or `noisy` (see the module)."""
    if ratio is None or half is None or not math.isfinite(half):
        return "noisy"
    if half < abs(ratio - 1):
        return "measured"
    if half <= NEGLIGIBLE:
        return "negligible"
    return "noisy"


def load_now() -> dict[str, Any]:
    """The node's load: the 1-minute load average and the CPUs this process may use."""
    try:
        load = round(os.getloadavg()[0], 2)
    except OSError:  # pragma: no cover - a platform without a load average
        load = None
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        os.cpu_count()
    return {"load": load, "cpus": cpus}


def words(found: dict[str, Any] | None, *, load: dict[str, Any] | None = None) -> str:
    """A mode's cost in words: "+12 % [+10, +14]", "no cost above ± 3 %", or "not
    measurable on this node now (...)"."""
    if not found or found.get("ratio") is None:
        return "not measured"
    ratio, half = float(found["ratio"]), half_width(found)
    kind = verdict(ratio, half)
    if kind == "measured":
        return (f"{(ratio - 1) * 100:+.1f} % [{(found['ratio_low'] - 1) * 100:+.1f}, "
                f"{(found['ratio_high'] - 1) * 100:+.1f}]")
    if kind == "negligible":
        return f"no cost above ± {max(half or 0.0, 0.001) * 100:.1f} %"
    why = [f"± {half * 100:.0f} %" if half is not None else "no interval"]
    if load and load.get("load") is not None:
        why.insert(0, f"load {load['load']} on {load.get('cpus')} CPUs")
    return f"not measurable on this node now ({', '.join(why)})"
