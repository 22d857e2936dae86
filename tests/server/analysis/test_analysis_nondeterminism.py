"""Nondeterministic ops per environment and device model, with the selective cost
against strict (analysis/nondeterminism.py, design §3.3.12), over plain values."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from numparity_server.analysis.nondeterminism import (
    OMP_DYNAMIC_CAUSE,
    Repeated,
    Study,
    determinism,
    environment_cause,
)

OP = "aten.index_add_.default"


def _study(strict: tuple[float, float, float], selective: tuple[float, float, float] | None,
           *, selective_repeatable: bool = True, op_recipe: str | None =
           "deterministic_algorithms", no_recipe: str | None = None, load: float = 0.5
           ) -> dict[str, Any]:
    """A study as the agent sends it: each mode's paired ratio (ratio, low, high)."""
    op = {"op": OP, "module": "encoder.pool", "phase": "backward", "index": 7, "count": 2,
          "shapes": [[64, 48]], "dtypes": ["float32"], "kernel": None, "recipe": op_recipe,
          "no_recipe": no_recipe}

    def mode(found: tuple[float, float, float], repeatable: bool) -> dict[str, Any]:
        return {"wall_s": found[0], "repeatable": repeatable, "ratio": found[0],
                "ratio_low": found[1], "ratio_high": found[2]}

    cost: dict[str, Any] = {
        "rounds": 12, "load": {"load": load, "cpus": 16},
        "default": {"wall_s": 1.0, "repeatable": False},
        "strict": mode(strict, True)}
    if selective is not None:
        cost["selective"] = mode(selective, selective_repeatable)
    return {"traced": True, "ops": [op], "cost": cost}


def test_the_op_with_selective_and_strict_costs_from_two_devices() -> None:
    studies = [Study(1, "cuda/H200/9.0", "gpu-1", "probes", "default",
                     _study((2.00, 1.90, 2.10), (1.025, 1.015, 1.035))),
               Study(1, "cuda/H200/9.0", "gpu-2", "probes", "default",
                     _study((2.30, 1.80, 2.80), (1.10, 0.70, 1.50), load=7.5))]
    rows = determinism([Repeated(1, "cuda/H200/9.0", "probes", "default", 2, False),
                        Repeated(2, "cpu", "probes", "default", 1, True)], studies)
    nd, steady = rows
    assert steady.deterministic and not nd.deterministic
    (op,) = nd.ops
    assert (op.op, op.module, op.phase, op.results, op.first) == (
        OP, "encoder.pool", "backward", 2, True)
    # Oracle: inverse-variance weights from each 95 % interval's half-width (numpy).
    for got, found in ((op.selective, [(1.025, 0.01), (1.10, 0.40)]),
                       (op.strict, [(2.00, 0.10), (2.30, 0.50)])):
        assert got is not None
        values = np.array([v for v, _ in found])
        sigma = np.array([h for _, h in found]) / 1.959964
        weights = 1 / sigma ** 2
        assert got.ratio == pytest.approx(float(np.average(values, weights=weights)))
        assert got.uncertainty == pytest.approx(1.959964 / math.sqrt(weights.sum()))
        assert got.low == pytest.approx(got.ratio - got.uncertainty)
        assert got.repeatable is True and got.studies == 2
        assert got.verdict == "measured" and got.shown
    # The precise node dominates: the loaded node's wide interval hardly moves it.
    assert op.selective is not None and op.strict is not None
    assert op.selective.words.startswith("+2.") and op.strict.words.startswith("+10")
    assert op.cost == f"selective: {op.selective.words}; strict: {op.strict.words}"
    assert nd.summary.startswith(f"nondeterministic: {OP} in encoder.pool (backward)")


def test_a_cost_wider_than_its_effect_is_not_measurable_not_a_figure() -> None:
    (row,) = determinism([], [Study(1, "cpu", "n", "w", "default",
                                    _study((1.73, 0.10, 3.58), (1.01, 0.99, 1.03),
                                           load=13.9))])
    (op,) = row.ops
    assert op.strict is not None and op.strict.verdict == "noisy" and not op.strict.shown
    assert op.strict.words == "not measurable on this node now (load 13.9 on 16 CPUs, ± 185 %)"
    assert op.selective is not None and op.selective.verdict == "negligible"
    assert op.selective.words == "no cost above ± 2.0 %"
    assert "73" not in op.cost


def test_a_study_from_an_agent_before_paired_rounds_gives_its_ratio_of_medians() -> None:
    study = _study((1.0, 1.0, 1.0), None)
    study["cost"] = {"rounds": 3,
                     "default": {"wall_s": 1.0, "wall_s_spread": 0.01, "repeatable": False},
                     "strict": {"wall_s": 2.0, "wall_s_spread": 0.02, "repeatable": True}}
    (row,) = determinism([], [Study(1, "cpu", "n", "w", "default", study)])
    strict = row.ops[0].strict
    assert strict is not None
    assert strict.ratio == pytest.approx(2.0)
    assert strict.uncertainty == pytest.approx(2.0 * math.hypot(0.01, 0.01))
    assert strict.verdict == "measured"


def test_a_host_data_source_is_the_row_s_summary() -> None:
    source = {"op": "aten.sort.default", "module": "scatter", "phase": "forward",
              "index": 2, "count": 1, "source": "host_data", "what": "a tensor …",
              "recipe": "seed_generator", "advice": "seed the generator that made it",
              "at": "lab/model.py:24 in forward"}
    (row,) = determinism([Repeated(1, "cpu", "w", "default", 1, False)],
                         [Study(1, "cpu", "n", "w", "default",
                                {"traced": True, "ops": [], "sources": [source],
                                 "note": "no op gives other bits"})])
    assert row.ops == [] and row.untraced == []
    (found,) = row.sources
    assert (found.op, found.module, found.source, found.recipe, found.at, found.results) == (
        "aten.sort.default", "scatter", "host_data", "seed_generator",
        "lab/model.py:24 in forward", 1)
    assert row.summary.startswith("nondeterministic: the difference enters from outside "
                                  "torch's ops at aten.sort.default in scatter (forward, "
                                  "called at lab/model.py:24 in forward)")
    # A node's study: the summary says whose claim it is.
    assert row.summary.endswith("seed the generator that made it (claimed by n)")
    assert found.claimed_by == ["n"]


def test_a_recipe_that_does_not_make_it_repeatable_says_so() -> None:
    (row,) = determinism([], [Study(1, "cpu", "n", "w", "default",
                                    _study((1.5, 1.4, 1.6), (1.1, 1.05, 1.15),
                                           selective_repeatable=False))])
    assert row.ops[0].cost.startswith("the selective recipe did not make it repeatable")


def test_an_op_without_a_recipe_says_why_and_strict_s_cost() -> None:
    (row,) = determinism([], [Study(1, "cuda/A100/8.0", "n", "w", "default", _study(
        (1.5, 1.4, 1.6), None, op_recipe=None,
        no_recipe="torch has no deterministic cuda implementation of histc"))])
    (op,) = row.ops
    assert op.selective is None
    assert op.cost.startswith("no selective recipe: torch has no deterministic cuda "
                              "implementation of histc; strict: +50.0 % [+40.0, +60.0]")


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
