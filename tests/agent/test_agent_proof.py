"""What `check --json` states of its plan (issue 44): the benchmarks' figures, pooled
over the plan's workloads, never invented per node."""

from __future__ import annotations

from fractions import Fraction

from numparity_agent import _proof

FIGURES = {
    "coverage": {
        "measured_at": "2026-11-28T22:40:00Z", "masked": 0.12, "nan_inf_alone": 0.01,
        "workloads": {
            "mlp": {"single": [40, 40], "single_by_class": {"matmul": [30, 30],
                                                             "elementwise": [10, 10]}},
            "train": {"single": [60, 45], "single_by_class": {"matmul": [20, 17],
                                                               "reduction": [40, 28]}},
            "cnn": {"single": [50, 50], "single_by_class": {"conv": [50, 50]}},
        },
    },
    "false_alarms": {"measured_at": "2026-11-28T23:20:00Z", "answer_evaluations": 11900,
                     "answers_differing": 0, "checks": 100, "check_no_go": 0,
                     "suspects": 0},
}


def test_the_plans_coverage_is_pooled_over_its_measured_workloads():
    proof = _proof.plan_proof(["mlp", "train", "gemm"], FIGURES)
    assert proof is not None
    assert proof["single_bit_injected"] == 100
    assert proof["single_bit_seen"] == float(Fraction(85, 100))
    assert proof["single_bit_by_class"] == {"elementwise": 1.0, "matmul": round(47 / 50, 4),
                                            "reduction": 0.7}
    assert proof["workloads_measured"] == ["mlp", "train"]
    assert proof["workloads_not_measured"] == ["gemm"]


def test_the_false_alarm_bound_is_the_rule_of_three():
    proof = _proof.plan_proof(["cnn"], FIGURES)
    assert proof is not None
    assert (proof["false_no_go"], proof["honest_evaluations"]) == (0, 12000)
    assert proof["false_no_go_bound"] == round(3 / 12000, 6)
    assert "0 false no-go in 12000 honest evaluations (rate < 0.00025 at 95 %)" \
        in proof["statement"]
    alarmed = {**FIGURES, "false_alarms": {**FIGURES["false_alarms"], "check_no_go": 1}}
    proof = _proof.plan_proof(["cnn"], alarmed)
    assert proof is not None and proof["false_no_go"] == 1
    assert proof["false_no_go_bound"] is None


def test_without_figures_nothing_is_stated():
    assert _proof.plan_proof(["mlp"], {}) is None


def test_the_shipped_figures_are_read():
    shipped = _proof.figures()
    assert shipped is not None and {"coverage", "false_alarms"} <= set(shipped)
    proof = _proof.plan_proof(shipped["coverage"]["plan"])
    assert proof is not None and proof["single_bit_seen"] is not None
    assert proof["workloads_not_measured"] == []
