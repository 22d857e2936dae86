"""A result's `nondeterminism` (design §2.13) on ingest: stored on the result as sent; a
bad one is 422 naming the field, and nothing is stored."""

from __future__ import annotations

from typing import Any

import pytest
from helpers.documents import run_document
from sqlalchemy import func, select

from numparity_server.kit.db import get_engine, session_factory
from numparity_server.models import Result, Run

STUDY: dict[str, Any] = {
    "traced": True,
    "ops": [{"op": "aten.index_add_.default", "module": "pool", "phase": "backward",
             "index": 12, "count": 2, "shapes": [[64, 48], [64], None],
             "dtypes": ["float32", "int64", None], "kernel": "indexFuncLargeIndex",
             "recipe": "deterministic_algorithms",
             "flags": ["torch.use_deterministic_algorithms(True)"]}],
    "cost": {"rounds": 3, "scopes": [{"module": "pool", "phases": ["backward"],
                                      "recipes": ["deterministic_algorithms"]}],
             "default": {"wall_s": 0.5, "wall_s_spread": 0.01, "repeatable": False,
                         "differ": ["output"], "wall_s_rounds": [0.6, 0.5, 0.5]},
             "strict": {"wall_s": 0.9, "wall_s_spread": 0.02, "repeatable": True,
                        "ratio": 1.8, "ratio_low": 1.7, "ratio_high": 1.95,
                        "verdict": "measured", "cost": "+80.0 % [+70.0, +95.0]"},
             "selective": {"wall_s": 0.52, "wall_s_spread": 0.01, "repeatable": True,
                           "ratio": 1.04, "ratio_low": 0.7, "ratio_high": 1.6,
                           "verdict": "noisy", "cost": "not measurable on this node now "
                                                       "(load 9.5 on 2 CPUs, ± 56 %)"},
             "seconds": 4.2, "confidence": 0.95, "load": {"load": 9.5, "cpus": 2}},
    "sources": [{"op": "aten.sort.default", "module": "scatter", "phase": "forward",
                 "index": 2, "count": 1, "source": "host_data", "what": "a tensor …",
                 "recipe": "seed_generator", "advice": "seed the generator that made it",
                 "input": {"position": 0, "dtype": "int64", "shape": [64]},
                 "at": "lab/model.py:24 in forward"}],
}


def _studies(api: Any) -> list[Any]:
    with session_factory(get_engine(api.settings))() as session:
        return list(session.scalars(select(Result.nondeterminism).order_by(Result.id)))


def test_a_study_is_stored_on_its_result(api: Any) -> None:
    document = run_document()
    document["results"][0]["repeats_agree"] = False
    document["results"][0]["nondeterminism"] = STUDY
    response = api.post_run(document)
    assert response.status_code == 201, response.text
    stored = _studies(api)
    (op,) = stored[0]["ops"]
    assert {k: op[k] for k in STUDY["ops"][0]} == STUDY["ops"][0]
    for mode in ("default", "strict", "selective"):
        sent = STUDY["cost"][mode]
        assert {k: stored[0]["cost"][mode][k] for k in ("wall_s", "wall_s_spread",
                                                        "repeatable")} == \
            {k: sent[k] for k in ("wall_s", "wall_s_spread", "repeatable")}
    assert stored[0]["cost"]["scopes"] == STUDY["cost"]["scopes"]
    # The paired ratios, their intervals and verdicts, the load; the sources (issue 43).
    for mode in ("strict", "selective"):
        sent = STUDY["cost"][mode]
        assert {k: stored[0]["cost"][mode][k] for k in sent if k != "wall_s_rounds"} == sent
    assert stored[0]["cost"]["load"] == {"load": 9.5, "cpus": 2}
    assert stored[0]["sources"] == STUDY["sources"]
    # The rounds' times are the agent's, not stored.
    assert "wall_s_rounds" not in stored[0]["cost"]["default"]
    assert all(study is None for study in stored[1:])


@pytest.mark.parametrize(("path", "value"), [
    (["ops", 0, "phase"], "sideways"),
    (["ops", 0, "recipe"], "pray"),
    (["ops", 0, "op"], ""),
    (["ops"], [STUDY["ops"][0]] * 65),
    (["cost", "default", "wall_s"], -1.0),
    (["cost", "strict", "repeatable"], "yes"),
    (["cost", "strict", "verdict"], "fine"),
    (["sources", 0, "source"], "magic"),
    (["sources", 0, "recipe"], "pray"),
    (["traced"], "true"),
])
def test_a_bad_study_is_422_naming_the_field(api: Any, path: list[Any], value: Any) -> None:
    study: Any = {**STUDY, "ops": [dict(STUDY["ops"][0])],
                  "sources": [dict(STUDY["sources"][0])],
                  "cost": {**STUDY["cost"], "default": dict(STUDY["cost"]["default"]),
                           "strict": dict(STUDY["cost"]["strict"])}}
    target = study
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    document = run_document()
    document["results"][0]["nondeterminism"] = study
    response = api.post_run(document)
    assert response.status_code == 422, response.text
    named = [error["loc"] for error in response.json()["detail"]]
    prefix = ["body", "results", 0, "nondeterminism", *path]
    assert any(loc[: len(prefix)] == prefix for loc in named), named
    with session_factory(get_engine(api.settings))() as session:
        assert session.scalar(select(func.count()).select_from(Run)) == 0
