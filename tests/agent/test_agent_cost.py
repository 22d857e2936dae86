"""What determinism costs, with an uncertainty that means something (design §2.13,
`_cost`): paired rounds, the median ratio's bootstrap interval, and no figure when the
interval is wider than the effect."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from numparity_agent import _cost
from numparity_agent._runner import study_nondeterminism
from numparity_agent.testing import load_workload, variant

CPU = torch.device("cpu")
E2E = Path(__file__).resolve().parents[1] / "e2e"
COSTLY = "nondeterministic_op_workload:costly_determinism"


def test_paired_rounds_see_through_a_load_that_falls_on_whole_rounds() -> None:
    # Bursty load: each round's runs all slowed by the same factor (1x to 30x), each run
    # also by ±2 % of its own; strict truly costs +50 %.
    rng = np.random.default_rng(7)
    load = np.exp(rng.uniform(0, np.log(30), size=15))
    default = list(0.010 * load * rng.uniform(0.98, 1.02, size=15))
    strict = list(0.015 * load * rng.uniform(0.98, 1.02, size=15))
    found = _cost.paired_ratio(default, strict)
    # Oracle: numpy's median of the round-by-round ratios.
    assert found["ratio"] == pytest.approx(float(np.median(np.array(strict) / default)))
    assert found["ratio_low"] <= 1.5 <= found["ratio_high"]
    assert _cost.half_width(found) < 0.03
    assert _cost.verdict(found["ratio"], _cost.half_width(found)) == "measured"
    assert _cost.words(found).startswith(f"{(found['ratio'] - 1) * 100:+.1f} % [")
    # The old rule, half the spread of each mode's own times, drowns the same effect.
    old = (max(strict) - min(strict)) / 2 / float(np.median(default))
    assert old > abs(found["ratio"] - 1)  # the effect "within the noise"


@pytest.mark.parametrize(("ratio", "low", "high", "verdict", "words"), [
    (1.20, 1.15, 1.26, "measured", "+20.0 % [+15.0, +26.0]"),
    (1.01, 0.99, 1.03, "negligible", "no cost above ± 2.0 %"),
    (1.73, 0.10, 3.58, "noisy", "not measurable on this node now (load 3.5 on 2 CPUs, "
                                "± 185 %)"),
    (18.95, 1.0, 38.0, "noisy", "not measurable on this node now (load 3.5 on 2 CPUs, "
                                "± 1905 %)"),
])
def test_a_figure_is_stated_only_when_its_interval_is_narrower_than_it(
        ratio: float, low: float, high: float, verdict: str, words: str) -> None:
    found = {"ratio": ratio, "ratio_low": low, "ratio_high": high}
    assert _cost.verdict(ratio, _cost.half_width(found)) == verdict
    assert _cost.words(found, load={"load": 3.5, "cpus": 2}) == words


def _busy_loop(cpu: int) -> subprocess.Popen[bytes]:
    """A process that spins on `cpu` for at most 60 s (killed by the test before)."""
    code = ("import os, time\n"
            f"os.sched_setaffinity(0, {{{cpu}}})\n"
            "end = time.monotonic() + 60\n"
            "while time.monotonic() < end:\n    pass\n")
    return subprocess.Popen([sys.executable, "-c", code])


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no CPU affinity here")
def test_under_a_busy_loop_the_cost_is_consistent_or_not_measurable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(E2E))
    workload = load_workload(COSTLY)

    def study() -> dict[str, dict[str, object]]:
        found = study_nondeterminism(workload, variant=variant("default"),
                                     dtype=torch.float32, device=CPU, rounds=3, budget_s=1)
        assert [op["module"] for op in found["ops"]] == ["pool"], found
        return found["cost"]

    quiet = study()
    cpus = sorted(os.sched_getaffinity(0))
    busy = _busy_loop(cpus[-1])
    try:
        loaded = study()
    finally:
        busy.kill()
        busy.wait(timeout=10)
    assert loaded["load"]["cpus"] == len(cpus)
    for mode in ("strict", "selective"):
        for cost in (quiet[mode], loaded[mode]):
            ratio, low, high = cost["ratio"], cost["ratio_low"], cost["ratio_high"]
            half = max(ratio - low, high - ratio)
            # Never a number whose interval exceeds it.
            if cost["verdict"] == "measured":
                assert half < abs(ratio - 1)
                assert cost["cost"].startswith(f"{(ratio - 1) * 100:+.1f} % [")
            elif cost["verdict"] == "negligible":
                assert half <= _cost.NEGLIGIBLE
            else:
                assert cost["cost"].startswith("not measurable on this node now (load ")
        # Loaded, a stated interval holds the quiet machine's figure (within the quiet
        # figure's own interval: both are estimates of one cost).
        if loaded[mode]["verdict"] != "noisy" and quiet[mode]["verdict"] != "noisy":
            assert loaded[mode]["ratio_low"] <= quiet[mode]["ratio_high"]
            assert quiet[mode]["ratio_low"] <= loaded[mode]["ratio_high"]
