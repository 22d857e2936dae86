"""The measured proof of catch (issue 44) the audit states beside its suspects: what
`check`'s plan was measured to see and how often honest nodes were called wrong.

Read from the figures file the benchmarks write (`bench/coverage.py`,
`bench/false_alarms.py`) and the agent package ships (`numparity_agent/
proof_of_catch.json`, the file `check --json` reads): one measurement, stated the same
way by both, never invented per node or per request.
"""

from __future__ import annotations

import functools
from typing import Any

from numparity_server.audit.schemas import ProofOut
from numparity_server.kit.figures import figures


def _pct(value: Any) -> str:
    return f"{100 * float(value):.1f} %"


@functools.lru_cache(maxsize=1)
def proof_of_catch() -> ProofOut | None:
    """The figures, or None when the file is missing or unreadable (an install without
    the agent package)."""
    found = figures()
    if found is None:
        return None
    coverage = found.get("coverage") or {}
    alarms = found.get("false_alarms") or {}
    trials = int(alarms.get("answer_evaluations") or 0) + int(alarms.get("checks") or 0)
    false = int(alarms.get("answers_differing") or 0) + int(alarms.get("check_no_go") or 0)
    parts = []
    if coverage.get("plan_single_bit_seen") is not None:
        parts.append(
            f"check's plan ({', '.join(coverage.get('plan') or [])}) sees "
            f"{_pct(coverage['plan_single_bit_seen'])} of single-bit faults injected into "
            f"its op outputs; the whole suite {_pct(coverage['suite_single_bit_seen'])}, "
            f"{_pct(coverage.get('masked') or 0)} masked (no recorded bit changed), "
            f"{_pct(coverage.get('nan_inf_alone') or 0)} visible to a NaN/Inf check alone")
    if trials:
        parts.append(f"{false} false no-go in {trials} honest evaluations"
                     + (f" (rate < {3 / trials:.2g} at 95 %, rule of three)" if false == 0
                        else "")
                     + f", {int(alarms.get('suspects') or 0)} suspects among "
                     f"{int(alarms.get('honest_runs') or 0)} honest runs")
    return ProofOut(
        statement="; ".join(parts) or "not measured",
        plan=list(coverage.get("plan") or []),
        plan_single_bit_seen=coverage.get("plan_single_bit_seen"),
        suite_single_bit_seen=coverage.get("suite_single_bit_seen"),
        plan_share_of_suite=coverage.get("plan_share_of_suite"),
        masked=coverage.get("masked"),
        nan_inf_alone=coverage.get("nan_inf_alone"),
        injections=coverage.get("injections"),
        coverage_measured_at=coverage.get("measured_at"),
        honest_evaluations=trials or None,
        false_no_go=false if trials else None,
        false_no_go_bound=round(3 / trials, 6) if trials and false == 0 else None,
        suspects_in_honest_runs=alarms.get("suspects"),
        conditions=list(alarms.get("conditions") or []),
        false_alarms_measured_at=alarms.get("measured_at"),
    )
