"""The measured proof of catch (issue 44), as the benchmarks wrote it: the figures file
the agent package ships (`numparity_agent/proof_of_catch.json`, written only by
`bench/coverage.py` and `bench/false_alarms.py`). Read once per process; one
measurement, never invented per node or per request. The audit states it
(`audit.proof`); `check`'s choice ranks by its per-workload coverage
(`analysis.goldens.choose_checks`).
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

FIGURES_PACKAGE = "numparity_agent"
FIGURES_FILE = "proof_of_catch.json"


@functools.lru_cache(maxsize=1)
def figures() -> dict[str, Any] | None:
    """The file's object, or None when it is missing or unreadable (an install without
    the agent package)."""
    try:
        text = resources.files(FIGURES_PACKAGE).joinpath(FIGURES_FILE).read_text("utf-8")
        found = json.loads(text)
    except (OSError, ValueError, ModuleNotFoundError):
        return None
    return found if isinstance(found, dict) else None


@functools.lru_cache(maxsize=1)
def workload_coverage() -> dict[str, dict[str, float]]:
    """Per workload, per op class: the share of single-bit faults injected into that
    class's op outputs that changed a recorded bit (`coverage.workloads.*.
    single_by_class`, [injections, seen]); empty when not measured."""
    found: dict[str, dict[str, float]] = {}
    workloads = ((figures() or {}).get("coverage") or {}).get("workloads") or {}
    if not isinstance(workloads, dict):
        return found
    for workload, entry in workloads.items():
        by_class = entry.get("single_by_class") if isinstance(entry, dict) else None
        if not isinstance(by_class, dict):
            continue
        shares = {}
        for op_class, counts in by_class.items():
            try:
                injected, seen = (int(n) for n in counts)
            except (TypeError, ValueError):
                continue
            if injected > 0 and 0 <= seen <= injected:
                shares[str(op_class)] = seen / injected
        found[str(workload)] = shares
    return found
