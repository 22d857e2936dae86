"""`choose_checks` with the measured coverage (issue 44): most coverage per second within
the budget, after the tiers that decide first (strict, pinned, split).

The expected plans are worked out by hand with exact fractions from the coverage given,
not read back from the code.
"""

from __future__ import annotations

from fractions import Fraction
from itertools import combinations

import pytest

from numparity_server.analysis.goldens import (
    CheckCandidate,
    check_rank,
    choose_checks,
    plan_coverage,
)
from numparity_server.kit.figures import workload_coverage

# wall_s chosen so that cost() = 0.5 + 2 * wall_s is a round number of seconds.
BIG = CheckCandidate("big", "strict", "fleet", 0.75, False, True)  # cost 2 s
CHEAP = CheckCandidate("cheap", "strict", "fleet", 0.0, False, True)  # cost 0.5 s
CONV = CheckCandidate("conv", "strict", "fleet", 0.25, False, False)  # cost 1 s
SAME = CheckCandidate("same", "strict", "fleet", 0.0, False, True)  # cost 0.5 s
COVERAGE = {
    "big": {"matmul": 1.0, "reduction": 1.0},
    "cheap": {"matmul": 0.5},
    "conv": {"conv": 0.8},
    "same": {"matmul": 1.0, "reduction": 1.0},
}


def names(chosen: list[CheckCandidate]) -> list[str]:
    return [c.workload for c in chosen]


def test_plan_coverage_is_each_class_missed_only_when_every_workload_misses_it():
    coverage = {"a": {"matmul": 0.5, "conv": 0.25}, "b": {"matmul": 0.5}}
    # matmul: 1 - 1/2 * 1/2 = 3/4; conv: 1/4; mean over the two classes.
    assert plan_coverage(["a", "b"], coverage) == pytest.approx(float(
        (Fraction(3, 4) + Fraction(1, 4)) / 2))
    assert plan_coverage(["b"], coverage) == pytest.approx(0.25)
    assert plan_coverage(["a", "a"], coverage) == plan_coverage(["a"], coverage)
    assert plan_coverage([], coverage) == 0.0 and plan_coverage(["a"], {}) == 0.0


def test_without_coverage_the_order_is_the_tiers_then_layered_then_cheapest():
    chosen = choose_checks([BIG, CONV, CHEAP, SAME], budget_s=100, child_s=0)
    assert chosen == sorted([BIG, CONV, CHEAP, SAME], key=check_rank)
    assert names(chosen) == ["cheap", "same", "big", "conv"]


def test_the_most_coverage_per_second_first_and_what_adds_none_last():
    chosen = choose_checks([BIG, CONV, CHEAP, SAME], budget_s=100, child_s=0,
                           coverage=COVERAGE)
    # Gains per second over the three classes (matmul, reduction, conv), by hand:
    # first: same (2/3 in 0.5 s = 4/3) beats big (2/3 in 2 s), cheap (1/6 in 0.5 s),
    # conv (0.8/3 in 1 s = 4/15). Then big and cheap add nothing (their classes are
    # seen), conv adds 4/15: conv. Then the two that add none, layered and cheapest first.
    assert names(chosen) == ["same", "conv", "cheap", "big"]
    # And the plan's coverage after each step only grows, and is 1 where it can be.
    steps = [plan_coverage(names(chosen)[:n], COVERAGE) for n in range(1, 5)]
    assert steps == sorted(steps)
    assert steps[1] == pytest.approx(float((1 + 1 + Fraction(4, 5)) / 3))


def test_within_the_budget_the_greedy_plan_is_as_good_as_the_best_pair():
    # Three seconds of budget: the two-answer plans that fit, searched exhaustively.
    candidates = [BIG, CONV, CHEAP]
    chosen = choose_checks(candidates, budget_s=3, child_s=0, coverage=COVERAGE, max_keys=2)
    best = max((plan_coverage([a.workload, b.workload], COVERAGE)
                for a, b in combinations(candidates, 2) if a.cost() + b.cost() <= 3))
    assert plan_coverage(names(chosen), COVERAGE) == pytest.approx(best)
    assert sum(c.cost() for c in chosen) <= 3


def test_coverage_never_outranks_a_split_or_pinned_answer():
    split = CheckCandidate("split", "strict", "fleet", 5.0, True, False)
    pinned = CheckCandidate("pinned", "strict", "pin", 5.0, False, False)
    loose = CheckCandidate("same", "default", "fleet", 0.0, False, True)
    chosen = choose_checks([SAME, split, loose, pinned], budget_s=100, child_s=0,
                           coverage=COVERAGE)
    assert names(chosen)[:2] == ["pinned", "split"]
    assert chosen[2] == SAME and chosen[3] == loose  # strict before any other variant


def test_the_shipped_figures_give_each_measured_workload_its_classes():
    coverage = workload_coverage()
    assert coverage, "the agent package ships proof_of_catch.json with coverage"
    for workload, shares in coverage.items():
        assert shares and all(0.0 <= s <= 1.0 for s in shares.values()), workload
    # The transformer runs attention; an MLP does not.
    assert "attention" in coverage["transformer"] and "attention" not in coverage["mlp"]
