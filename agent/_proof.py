"""Proof of catch (issue 44): what the benchmarks measured a check to see, and how often
an honest node was called wrong — stated beside a verdict, never invented per node.

The figures live in `proof_of_catch.json`, next to this module, written only by
`bench/coverage.py` (`coverage`: seeded op drills, per workload of the standard suite's
`strict`) and `bench/false_alarms.py` (`false_alarms`: honest evaluations of the plan
under noise). `check --json` states them for the plan the device ran (`plan_proof`), the
server's audit reads the same file.

This module does not import torch.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from importlib import resources
from typing import Any

FIGURES_FILE = "proof_of_catch.json"


def figures() -> dict[str, Any] | None:
    """The benchmarks' latest figures, or None when the file is missing or unreadable."""
    try:
        text = resources.files("numparity_agent").joinpath(FIGURES_FILE).read_text("utf-8")
        found = json.loads(text)
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def _ratio(seen: int, injected: int) -> float | None:
    return round(seen / injected, 4) if injected else None


def plan_proof(workloads: Sequence[str], found: dict[str, Any] | None = None
               ) -> dict[str, Any] | None:
    """What the figures say of a plan of `strict` `workloads`: single-bit faults injected
    into op outputs while those workloads ran (pooled over them, and by op class), the
    share seen; the workloads the benchmark did not measure; the false alarms measured;
    and one sentence. None without figures."""
    found = figures() if found is None else found
    if not found:
        return None
    coverage = found.get("coverage") or {}
    per_workload = coverage.get("workloads") or {}
    measured = [w for w in workloads if w in per_workload]
    injected = sum(int(per_workload[w]["single"][0]) for w in measured)
    seen = sum(int(per_workload[w]["single"][1]) for w in measured)
    by_class: dict[str, list[int]] = {}
    for w in measured:
        for cls, (n, k) in (per_workload[w].get("single_by_class") or {}).items():
            total = by_class.setdefault(cls, [0, 0])
            total[0] += int(n)
            total[1] += int(k)
    alarms = found.get("false_alarms") or {}
    share = _ratio(seen, injected)
    trials = int(alarms.get("answer_evaluations") or 0) + int(alarms.get("checks") or 0)
    false = int(alarms.get("answers_differing") or 0) + int(alarms.get("check_no_go") or 0)
    parts = []
    if share is not None:
        matmul = by_class.get("matmul")
        parts.append(f"this plan's workloads saw {share:.1%} of {injected} single-bit faults "
                     "injected into their op outputs"
                     + (f" ({_ratio(matmul[1], matmul[0]):.1%} in matmul outputs)"
                        if matmul and matmul[0] else ""))
    if trials:
        parts.append(f"{false} false no-go in {trials} honest evaluations"
                     + (f" (rate < {3 / trials:.2g} at 95 %)" if false == 0 else ""))
    return {
        "single_bit_seen": share,
        "single_bit_injected": injected,
        "single_bit_by_class": {c: _ratio(k, n) for c, (n, k) in sorted(by_class.items())},
        "workloads_measured": measured,
        "workloads_not_measured": [w for w in workloads if w not in per_workload],
        "masked": coverage.get("masked"),
        "nan_inf_alone": coverage.get("nan_inf_alone"),
        "coverage_measured_at": coverage.get("measured_at"),
        "false_no_go": false if trials else None,
        "honest_evaluations": trials or None,
        "false_no_go_bound": round(3 / trials, 6) if trials and false == 0 else None,
        "suspects_in_honest_runs": alarms.get("suspects"),
        "false_alarms_measured_at": alarms.get("measured_at"),
        "statement": "; ".join(parts) + ("" if not parts else
                                         " (measured on the benchmark's CPU, strict)"),
    }
