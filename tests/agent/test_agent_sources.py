"""Where a nondeterministic result's difference comes from when no op gives other bits on
the same inputs (design §2.13, `_sources`): host data, a Python choice of tensors, a
DataLoader's draw, a generator; named with the op that reads it, its module, the code
that called it and the recipe that applies.

The workloads are user workloads (`tests/e2e/host_data_workload.py`), run as the agent
runs them (`run_workload` with traces); the walk itself is also checked on traces
written by hand, where each kind of source is known.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from numparity_agent._sources import difference_sources
from numparity_agent.testing import load_workload, run_workload, variant

try:  # the wire check needs the server; the agent's tests run without it too
    from numparity_server.runs.schemas import NondeterminismDoc
except ImportError:
    NondeterminismDoc = None

CPU = torch.device("cpu")
E2E = Path(__file__).resolve().parents[1] / "e2e"


@pytest.fixture
def lab_workloads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(E2E))


def _study(name: str) -> dict[str, Any]:
    result = run_workload(load_workload(name), variant=variant("default"), device=CPU,
                          repeats=2, trace=True, study_budget_s=1)
    assert result["repeats_agree"] is False
    study: dict[str, Any] = result["nondeterminism"]
    assert study["traced"] is True and "error" not in study, study
    if NondeterminismDoc is not None:
        # The server reads it as the agent wrote it (the wire format is the agent's).
        wire = NondeterminismDoc.model_validate_json(json.dumps(study))
        assert [s.source for s in wire.sources] == [s["source"] for s in study["sources"]]
    return study


def _line(path: Path, text: str) -> int:
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def test_a_permutation_from_os_urandom_is_named_where_it_enters(lab_workloads: None) -> None:
    study = _study("host_data_workload:urandom_permutation")
    # Every op is deterministic on equal inputs: none is named, no cost is timed.
    assert study["ops"] == [] and "cost" not in study
    (source,) = study["sources"]  # index_add_ and the head read what it changed: consequences
    assert (source["op"], source["module"], source["phase"]) == (
        "aten.sort.default", "scatter", "forward")
    assert source["source"] == "host_data" and source["recipe"] == "seed_generator"
    assert source["input"] == {"position": 0, "dtype": "int64", "shape": [64]}
    line = _line(E2E / "host_data_workload.py", "os.urandom(h.shape[0])")
    assert source["at"] == f"e2e/host_data_workload.py:{line} in forward"
    assert "os.urandom" in source["advice"] and "seeded generator" in source["advice"]
    # The note says so; never that the passes computed the same bits.
    assert "computed the same bits" not in study["note"]
    assert study["note"].startswith("no op gives other bits on the same inputs: the "
                                    "difference enters from outside torch's ops at "
                                    "aten.sort.default in scatter")


def test_a_shuffling_dataloader_gets_the_dataloader_recipe(lab_workloads: None) -> None:
    study = _study("host_data_workload:shuffled_loader")
    assert study["ops"] == []
    first = study["sources"][0]
    # The sampler's seed, drawn from torch's generator inside the DataLoader.
    assert (first["op"], first["source"], first["via"]) == (
        "aten.random_.default", "dataloader", "DataLoader")
    assert {s["recipe"] for s in study["sources"]} == {"dataloader"}
    assert "generator=torch.Generator().manual_seed" in first["advice"]
    assert "worker_init_fn" in first["advice"]


def test_a_shuffled_python_list_is_an_order_source(lab_workloads: None) -> None:
    study = _study("nondeterministic_workload:unordered_sum")
    (source,) = study["sources"]
    assert (source["op"], source["source"], source["recipe"]) == (
        "aten.mul.Tensor", "order", "stable_order")
    assert "PYTHONHASHSEED" in source["advice"]


def _op(name: str, ins: list[str], outs: list[str], **extra: Any) -> dict[str, Any]:
    return {"op": name, "module": "m", "phase": "forward", "in": ins, "out": outs, **extra}


def test_the_walk_tells_each_source_from_a_consequence() -> None:
    first = {"ops": [
        _op("aten.empty.memory_format", [], ["u1"]),  # uninitialized: means nothing
        _op("aten.uniform_.default", ["u1"], ["r1"]),  # a generator draw
        _op("aten.mul.Tensor", ["r1"], ["m1"]),  # its consequence
        _op("aten.add.Tensor", ["w"], ["a1"], args="0.5"),  # a Python number
        _op("aten.exp.default", ["w"], ["e"]),
        _op("aten.relu.default", ["w"], ["f"]),
        _op("aten.mul.Tensor", ["e"], ["o1"]),  # Python chose e here, f there
    ], "views": [{"before": 6, "in": ["e"], "out": ["ev"]}]}
    second = {"ops": [
        _op("aten.empty.memory_format", [], ["u2"]),
        _op("aten.uniform_.default", ["u2"], ["r2"]),
        _op("aten.mul.Tensor", ["r2"], ["m2"]),
        _op("aten.add.Tensor", ["w"], ["a2"], args="0.7"),
        _op("aten.exp.default", ["w"], ["e"]),
        _op("aten.relu.default", ["w"], ["f"]),
        _op("aten.mul.Tensor", ["f"], ["o2"]),
    ]}
    sources, equal = difference_sources(first, second)
    assert not equal
    assert [(s["op"], s["index"], s["source"], s["recipe"]) for s in sources] == [
        ("aten.uniform_.default", 1, "generator", "seed_torch"),
        ("aten.add.Tensor", 3, "argument", "seed_generator"),
        ("aten.mul.Tensor", 6, "order", "stable_order")]


def test_equal_passes_are_said_equal_only_when_every_output_agrees() -> None:
    same = {"ops": [_op("aten.exp.default", ["w"], ["e"]), _op("aten.neg.default", ["e"],
                                                                ["n"])]}
    assert difference_sources(same, same) == ([], True)
    other = {"ops": [_op("aten.exp.default", ["w"], ["e"]), _op("aten.neg.default", ["e"],
                                                                 ["n2"])]}
    # An op that gives other bits on the same inputs is an op, not a source; not equal.
    assert difference_sources(same, other) == ([], False)
    # The workload's own input built with other values.
    built = {"ops": [_op("aten.exp.default", ["x1"], ["e1"])]}
    rebuilt = {"ops": [_op("aten.exp.default", ["x2"], ["e2"])]}
    (source,), _ = difference_sources(built, rebuilt, known=({"x1": "input x"},
                                                             {"x2": "input x"}))
    assert (source["source"], source["recipe"], source["input"]["name"]) == (
        "input", "seed_build", "input x")
