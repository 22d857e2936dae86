"""Nondeterministic ops per environment and device model, with the selective cost
against strict (analysis/nondeterminism.py, design §3.3.12), over plain values."""

from __future__ import annotations

import math
import statistics
from typing import Any

import pytest

from numparity_server.analysis.nondeterminism import (
    OMP_DYNAMIC_CAUSE,
    Repeated,
    Study,
    determinism,
    environment_cause,
)

OP = "aten.index_add_.default"


def _study(default: float, strict: float, selective: float | None, *, spread: float = 0.01,
           selective_repeatable: bool = True, op_recipe: str | None = "deterministic_algorithms",
           no_recipe: str | None = None) -> dict[str, Any]:
    op = {"op": OP, "module": "encoder.pool", "phase": "backward", "index": 7, "count": 2,
          "shapes": [[64, 48]], "dtypes": ["float32"], "kernel": None, "recipe": op_recipe,
          "no_recipe": no_recipe}
    cost: dict[str, Any] = {
        "rounds": 5,
        "default": {"wall_s": default, "wall_s_spread": spread, "repeatable": False},
        "strict": {"wall_s": strict, "wall_s_spread": spread, "repeatable": True}}
    if selective is not None:
        cost["selective"] = {"wall_s": selective, "wall_s_spread": spread,
                             "repeatable": selective_repeatable}
    return {"traced": True, "ops": [op], "cost": cost}


def test_an_environment_whose_repeats_agree_is_deterministic() -> None:
    (row,) = determinism([Repeated(1, "cpu", "mlp", "default", 3, True),
                          Repeated(1, "cpu", "cnn", "strict", 3, True)], [])
    assert row.deterministic and row.repeated == 6 and row.disagreeing == 0
    assert row.ops == [] and row.summary.startswith("deterministic")


def test_the_op_with_selective_and_strict_costs_from_two_devices() -> None:
    studies = [Study(1, "cuda/H200/9.0", "gpu-1", "probes", "default",
                     _study(1.00, 2.00, 1.10)),
               Study(1, "cuda/H200/9.0", "gpu-2", "probes", "default",
                     _study(1.02, 2.10, 1.14))]
    rows = determinism([Repeated(1, "cuda/H200/9.0", "probes", "default", 2, False),
                        Repeated(2, "cpu", "probes", "default", 1, True)], studies)
    nd, steady = rows
    assert steady.deterministic and not nd.deterministic
    (op,) = nd.ops
    assert (op.op, op.module, op.phase, op.results, op.first) == (
        OP, "encoder.pool", "backward", 2, True)
    # Oracle: the mean of the devices' times; uncertainty max(sd, mean spread) / sqrt(n),
    # the ratio's by relative uncertainties in quadrature.
    def measured(values: list[float]) -> tuple[float, float]:
        return statistics.mean(values), max(statistics.stdev(values), 0.01) / math.sqrt(2)

    default, selective, strict = measured([1.0, 1.02]), measured([1.1, 1.14]), \
        measured([2.0, 2.1])
    for got, (mean, err) in ((op.selective, selective), (op.strict, strict)):
        assert got is not None
        expected = mean / default[0]
        assert got.ratio == pytest.approx(expected)
        assert got.uncertainty == pytest.approx(expected * math.hypot(err / mean,
                                                                      default[1] / default[0]))
        assert got.repeatable is True
    assert op.cost == (f"deterministic for {(selective[0] / default[0] - 1) * 100:+.0f} % "
                       f"± {op.selective.uncertainty * 100:.0f} instead of "
                       f"{(strict[0] / default[0] - 1) * 100:+.0f} % ± "
                       f"{op.strict.uncertainty * 100:.0f}")
    assert op.cost.startswith("deterministic for +11 % ± ") and "instead of +103 % ± " in op.cost
    assert nd.summary.startswith(f"nondeterministic: {OP} in encoder.pool (backward)")


def test_a_recipe_that_does_not_make_it_repeatable_says_so() -> None:
    (row,) = determinism([], [Study(1, "cpu", "n", "w", "default",
                                    _study(1.0, 1.5, 1.1, selective_repeatable=False))])
    assert row.ops[0].cost.startswith("the selective recipe did not make it repeatable")


def test_an_op_without_a_recipe_says_why_and_strict_s_cost() -> None:
    (row,) = determinism([], [Study(1, "cuda/A100/8.0", "n", "w", "default", _study(
        1.0, 1.5, None, op_recipe=None,
        no_recipe="torch has no deterministic cuda implementation of histc"))])
    (op,) = row.ops
    assert op.selective is None
    assert op.cost.startswith("no selective recipe: torch has no deterministic cuda "
                              "implementation of histc; strict: +50 % ± ")


def test_untraced_results_are_listed_with_the_hint_and_the_cause_is_kept() -> None:
    (row,) = determinism(
        [Repeated(1, "cpu", "train", "default", 1, False)],
        [Study(1, "cpu", "lab-3", "train", "default",
               {"traced": False, "hint": "run it again with --trace-ops"}),
         Study(1, "cpu", "lab-4", "train", "default",
               {"traced": True, "ops": [], "cause": "OMP_DYNAMIC=true: libgomp …",
                "note": "the two traced passes computed the same bits"})])
    assert not row.deterministic and row.ops == []
    assert row.untraced == ["train/default on lab-3: run it again with --trace-ops",
                            "train/default on lab-4: the two traced passes computed the "
                            "same bits"]
    assert row.cause == "OMP_DYNAMIC=true: libgomp …"
    assert "no op named" in row.summary


def test_omp_dynamic_in_a_cpu_environment_is_said_without_traces() -> None:
    assert environment_cause({"env_vars.OMP_DYNAMIC": "TRUE"}, "cpu") == OMP_DYNAMIC_CAUSE
    assert environment_cause({"env_vars.OMP_DYNAMIC": "false"}, "cpu") is None
    assert environment_cause({"env_vars.OMP_DYNAMIC": "true"}, "cuda/H200/9.0") is None
    rows = determinism([Repeated(1, "cpu", "train", "default", 2, False),
                        Repeated(2, "cpu", "train", "default", 2, True)], [],
                       {(1, "cpu"): OMP_DYNAMIC_CAUSE, (2, "cpu"): OMP_DYNAMIC_CAUSE})
    unsteady, steady = rows
    assert unsteady.cause == OMP_DYNAMIC_CAUSE and "OMP_DYNAMIC" in unsteady.summary
    assert steady.deterministic and steady.cause is None  # said only where it bites
