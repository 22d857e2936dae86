"""Selective determinism in the agent (design §2.13): the ops that differ on the same
inputs, their recipes, the scoped flags and the cost study.

The nondeterministic op is a user workload's (`tests/e2e/nondeterministic_op_workload`):
a CPU has almost none of its own. The CUDA ops of torch's documented lists are tested
at the edge, as trace entries a GPU would record: unverified without a GPU.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.agent import clean_env, run_agent

from numparity_agent import _determinism
from numparity_agent._determinism import (
    OMP_DYNAMIC_CAUSE,
    nondeterministic_ops,
    recipe,
    recipe_code,
    scopes,
    selective,
)
from numparity_agent._runner import study_nondeterminism
from numparity_agent.testing import load_workload, run_workload, variant

CPU = torch.device("cpu")
E2E = Path(__file__).resolve().parents[1] / "e2e"
ND = "nondeterministic_op_workload:one_nondeterministic_op"
TWIN = "nondeterministic_op_workload:deterministic_twin"
OP = "numparity_lab.unordered_index_add.default"


@pytest.fixture
def lab_workloads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(E2E))


def _op(name: str, ins: list[str], outs: list[str], module: str = "m",
        phase: str = "forward", **extra: Any) -> dict[str, Any]:
    return {"op": name, "module": module, "phase": phase, "in": ins, "out": outs, **extra}


def _trace(ops: list[dict[str, Any]]) -> dict[str, Any]:
    return {"tensors": {"a": ["float32", [4, 3]], "i": ["int64", [4]]}, "ops": ops}


def test_only_ops_with_the_same_inputs_and_other_outputs_are_named() -> None:
    first = _trace([
        _op("aten.mm.default", ["a", "a"], ["b"]),
        _op("aten.index_add_.default", ["b", "i", "a"], ["c1"], module="pool"),
        # Reads the differing output: a consequence, not a cause.
        _op("aten.relu.default", ["c1"], ["d1"]),
        _op("aten.index_add_.default", ["b", "i", "a"], ["e1"], module="pool"),
        _op("aten.sum.default", ["a"], ["s1"], module="", phase="optimizer"),
    ])
    second = _trace([
        _op("aten.mm.default", ["a", "a"], ["b"]),
        _op("aten.index_add_.default", ["b", "i", "a"], ["c2"], module="pool"),
        _op("aten.relu.default", ["c2"], ["d2"]),
        _op("aten.index_add_.default", ["b", "i", "a"], ["e2"], module="pool"),
        _op("aten.sum.default", ["a"], ["s2"], module="", phase="optimizer"),
    ])
    found, parts_at = nondeterministic_ops(first, second)
    assert parts_at is None
    assert [(f["op"], f["module"], f["phase"], f["index"], f["count"]) for f in found] == [
        ("aten.index_add_.default", "pool", "forward", 1, 2),
        ("aten.sum.default", "", "optimizer", 4, 1)]
    assert found[0]["shapes"] == [None, [4], [4, 3]]
    assert found[0]["dtypes"] == [None, "int64", "float32"]


def test_other_arguments_or_another_op_sequence_stop_the_comparison() -> None:
    first = _trace([_op("aten.add.Tensor", ["a"], ["x"], args="1"),
                    _op("aten.mul.Tensor", ["a"], ["y"]), _op("aten.exp.default", ["a"], ["z"])])
    second = _trace([_op("aten.add.Tensor", ["a"], ["w"], args="2"),
                     _op("aten.div.Tensor", ["a"], ["v"]), _op("aten.exp.default", ["a"], ["u"])])
    found, parts_at = nondeterministic_ops(first, second)
    assert found == [] and parts_at == 1


@pytest.mark.parametrize(("op", "kernel", "expected"), [
    ("aten.index_add_.default", None, "deterministic_algorithms"),
    ("aten.scatter_add_.default", None, "deterministic_algorithms"),
    ("aten.embedding_dense_backward.default", None, "deterministic_algorithms"),
    ("aten._embedding_bag_dense_backward.default", None, "deterministic_algorithms"),
    ("aten.convolution_backward.default", "conv:Cudnn; cudnn::engine", "cudnn_deterministic"),
    ("aten._cudnn_rnn_backward.default", None, "cudnn_deterministic"),
    ("aten.max_pool3d_with_indices_backward.default", None, None),
    ("aten.upsample_bilinear2d_backward.default", None, None),
])
def test_recipes_of_cuda_ops_follow_torch_documentation(op: str, kernel: str | None,
                                                          expected: str | None) -> None:
    # Fakes at the edge: the trace entries a GPU would record. Unverified on a GPU here.
    entry = {"op": op, "module": "conv", "phase": "backward"}
    if kernel:
        entry["kernel"] = kernel
    found = recipe(entry, device_type="cuda", environ={})
    assert found["recipe"] == expected
    if expected is None:
        assert "no deterministic cuda implementation" in found["no_recipe"]


def test_omp_dynamic_on_a_cpu_is_the_cause_not_an_op_to_scope() -> None:
    entry = {"op": "aten.mm.default", "module": "fc1", "phase": "backward"}
    found = recipe(entry, device_type="cpu", environ={"OMP_DYNAMIC": "TRUE"})
    assert found == {"recipe": None, "no_recipe": OMP_DYNAMIC_CAUSE}
    # A lab's own op may still honour the flag: tried, and the study says.
    own = recipe({**entry, "op": OP}, device_type="cpu", environ={"OMP_DYNAMIC": "true"})
    assert own["recipe"] == "deterministic_algorithms" and own["tried"] is True


class _Probe(torch.autograd.Function):
    """Identity that notes whether deterministic algorithms are on, forward and backward."""

    seen: list[tuple[str, str, bool]] = []

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, name: str) -> torch.Tensor:
        ctx.name = name
        _Probe.seen.append((name, "forward", torch.are_deterministic_algorithms_enabled()))
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        _Probe.seen.append((ctx.name, "backward", torch.are_deterministic_algorithms_enabled()))
        return grad.clone(), None


class _Probed(torch.nn.Module):
    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        self.fc = torch.nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(_Probe.apply(x, self.name))


def test_selective_turns_the_flag_on_in_the_named_module_only() -> None:
    model = torch.nn.Sequential(_Probed("a"), _Probed("b"), _Probed("c"))
    ops = [{"op": "aten.index_add_.default", "module": "1", "phase": "backward",
            "recipe": "deterministic_algorithms"},
           {"op": "aten.index_add_.default", "module": "1", "phase": "forward",
            "recipe": "deterministic_algorithms"}]
    assert scopes(ops) == [{"module": "1", "phases": ["backward", "forward"],
                            "recipes": ["deterministic_algorithms"]}]
    _Probe.seen.clear()
    assert not torch.are_deterministic_algorithms_enabled()
    with selective(model, scopes(ops)):
        model(torch.ones(2, 3, requires_grad=True)).sum().backward()
    assert not torch.are_deterministic_algorithms_enabled()
    assert sorted(_Probe.seen) == [
        ("a", "backward", False), ("a", "forward", False),
        ("b", "backward", True), ("b", "forward", True),
        ("c", "backward", False), ("c", "forward", False)]
    # The hooks are gone afterwards.
    _Probe.seen.clear()
    model(torch.ones(2, 3))
    assert ("b", "forward", False) in _Probe.seen


def test_the_study_names_the_custom_op_and_a_selective_run_that_is_repeatable(
        lab_workloads: None) -> None:
    result = run_workload(load_workload(ND), variant=variant("default"), device=CPU,
                          repeats=3, trace=True, study_budget_s=1)
    assert result["repeats_agree"] is False
    study = result["nondeterminism"]
    assert study["traced"] is True
    (op,) = study["ops"]  # the CPU's own ops (linear, exp) are deterministic
    assert (op["op"], op["module"], op["phase"]) == (OP, "pool", "forward")
    assert op["recipe"] == "deterministic_algorithms"
    cost = study["cost"]
    assert cost["rounds"] >= 6  # a warm-up and at least MIN_TIMED timed rounds
    assert cost["default"]["repeatable"] is False
    assert cost["strict"]["repeatable"] is True and cost["selective"]["repeatable"] is True
    assert cost["scopes"] == [{"module": "pool", "phases": ["forward"],
                               "recipes": ["deterministic_algorithms"]}]
    for mode in ("default", "strict", "selective"):
        assert cost[mode]["wall_s"] > 0 and cost[mode]["wall_s_spread"] >= 0
    for mode in ("strict", "selective"):
        assert cost[mode]["ratio_low"] <= cost[mode]["ratio"] <= cost[mode]["ratio_high"]
        assert cost[mode]["verdict"] in ("measured", "negligible", "noisy")


def test_a_deterministic_workload_has_no_study(lab_workloads: None) -> None:
    result = run_workload(load_workload(TWIN), variant=variant("default"), device=CPU,
                          repeats=2, trace=True)
    assert result["repeats_agree"] is True and "nondeterminism" not in result


def test_without_traces_the_result_says_how_to_name_the_op(lab_workloads: None) -> None:
    result = run_workload(load_workload(ND), variant=variant("default"), device=CPU,
                          repeats=2)
    assert result["nondeterminism"]["traced"] is False
    assert "--trace-ops" in result["nondeterminism"]["hint"]


def test_omp_dynamic_is_said_as_the_cause(lab_workloads: None,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_DYNAMIC", "true")
    found = study_nondeterminism(load_workload(ND), variant=variant("default"),
                                 dtype=torch.float32, device=CPU, rounds=3, budget_s=1)
    assert found["cause"] == OMP_DYNAMIC_CAUSE
    assert [op["op"] for op in found["ops"]] == [OP]


def test_the_pasted_recipe_makes_the_model_repeatable(lab_workloads: None) -> None:
    workload = load_workload(ND)
    result = run_workload(workload, variant=variant("default"), device=CPU, repeats=2,
                          trace=True, study_budget_s=1)
    code = recipe_code(result["nondeterminism"]["ops"], workload=ND)
    compile(code, "recipe", "exec")

    def outputs(with_recipe: bool) -> list[torch.Tensor]:
        found = []
        for _ in range(3):
            built = workload.build(dtype=torch.float32, device=CPU)
            if with_recipe:
                exec(code, {"model": built.model})  # noqa: S102 - the recipe as pasted
            with torch.no_grad():
                found.append(built.model(*built.inputs.values()))
        return found

    plain = outputs(False)
    assert not all(torch.equal(plain[0], other) for other in plain[1:])
    pasted = outputs(True)
    assert all(torch.equal(pasted[0], other) for other in pasted[1:])
    assert not torch.are_deterministic_algorithms_enabled()
    assert _determinism.packet(OP) == "numparity_lab.unordered_index_add"


# --- doctor ------------------------------------------------------------------------------

def test_doctor_warns_about_omp_dynamic() -> None:
    proc = run_agent("doctor", "--json", env=clean_env(OMP_NUM_THREADS="2",
                                                       MKL_NUM_THREADS="2", OMP_DYNAMIC="true"))
    assert proc.returncode == 0, proc.stderr
    (threads,) = [c for c in json.loads(proc.stdout)["checks"] if c["name"] == "threads"]
    assert threads["status"] == "warn"
    assert threads["message"].startswith("OMP_DYNAMIC=true: libgomp sizes each parallel "
                                         "region's thread team by the load average")
    assert "OMP_DYNAMIC=false" in threads["fix"]


def test_doctor_prints_the_recipe_of_a_run_document(tmp_path: Path) -> None:
    ops = [{"op": "aten.index_add_.default", "module": "encoder.pool", "phase": "backward",
            "recipe": "deterministic_algorithms"},
           {"op": "aten.convolution_backward.default", "module": "stem", "phase": "backward",
            "kernel": "cudnn", "recipe": "cudnn_deterministic"},
           {"op": "aten.histc.default", "module": "stats", "phase": "forward",
            "recipe": None, "no_recipe": "torch has no deterministic cuda implementation "
                                         "of histc"}]
    document = {"results": [
        {"workload": "lab:model", "variant": "default", "device": "cuda:0",
         "nondeterminism": {"traced": True, "ops": ops, "cost": {
             "default": {"wall_s": 1.0, "repeatable": False},
             "strict": {"wall_s": 2.0, "repeatable": True},
             "selective": {"wall_s": 1.1, "repeatable": True}}}},
        {"workload": "train", "variant": "default", "device": "cpu",
         "nondeterminism": {"traced": False, "hint": "run it again with --trace-ops"}},
        {"workload": "mlp", "variant": "default", "device": "cpu"}]}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(document))
    proc = run_agent("doctor", "--recipe", str(path))
    assert proc.returncode == 0, proc.stderr
    code = proc.stdout
    compile(code, "recipe", "exec")
    assert ("deterministic_only(model.get_submodule('encoder.pool'), cudnn=False, "
            "forward=False, backward=True)") in code
    assert ("deterministic_only(model.get_submodule('stem'), cudnn=True, forward=False, "
            "backward=True)") in code
    assert "# aten.histc.default in stats: torch has no deterministic cuda" in code
    assert "# train / default on cpu: nondeterministic; run it again with --trace-ops" in code
    assert "measured default 1.000000 s (not repeatable), strict 2.000000 s, selective " \
           "1.100000 s" in code

    # The helper works as pasted: the flag is on inside the module only, then restored.
    model = torch.nn.Sequential()
    model.add_module("stem", _Probed("stem"))
    model.add_module("encoder", torch.nn.Sequential())
    model.encoder.add_module("pool", _Probed("pool"))
    model.add_module("stats", _Probed("stats"))
    _Probe.seen.clear()
    namespace = {"model": model}
    exec(code, namespace)  # noqa: S102 - the recipe as a user pastes it
    model(torch.ones(2, 3, requires_grad=True)).sum().backward()
    assert not torch.are_deterministic_algorithms_enabled()
    assert sorted(_Probe.seen) == [
        ("pool", "backward", True), ("pool", "forward", False),
        ("stats", "backward", False), ("stats", "forward", False),
        ("stem", "backward", True), ("stem", "forward", False)]

    nothing = tmp_path / "steady.json"
    nothing.write_text(json.dumps({"results": [{"workload": "mlp"}]}))
    assert "nothing to make deterministic" in run_agent("doctor", "--recipe",
                                                         str(nothing)).stdout
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    refused = run_agent("doctor", "--recipe", str(broken))
    assert refused.returncode == 2 and "--recipe: cannot read a run document" in refused.stderr


def test_a_crafted_document_prints_names_as_data_never_as_code(tmp_path: Path) -> None:
    """Issue 39, finding 8: the names of a run document reach the printed recipe only as
    string literals or inside comments, whatever characters they hold."""
    escape = '")\nimport os; os.system("touch pwned")  # '
    ops = [{"op": "aten.index_add.default\nos.system('touch pwned')", "module": escape,
            "phase": "forward", "recipe": "deterministic_algorithms"},
           {"op": "aten.histc.default", "module": "stats\nos.system('x')", "phase": "forward",
            "recipe": None, "no_recipe": "none\rexec('x')"}]
    document = {"results": [
        {"workload": "lab:m\nimport os", "variant": "default", "device": "cpu",
         "nondeterminism": {"traced": True, "ops": ops, "cause": "a\u2028b\nos.abort()"}},
        {"workload": "w\nos.abort()", "variant": "default", "device": "cpu",
         "nondeterminism": {"traced": False, "hint": "x\nos.abort()"}}]}
    path = tmp_path / "crafted.json"
    path.write_text(json.dumps(document))
    proc = run_agent("doctor", "--recipe", str(path))
    assert proc.returncode == 0, proc.stderr
    tree = ast.parse(proc.stdout)
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    assert imported == {"torch"}
    called = {ast.unparse(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)}
    assert not any("system" in name or "abort" in name or name == "exec" for name in called)
    targets = [node.args[0].value for node in ast.walk(tree) if isinstance(node, ast.Call)
               and ast.unparse(node.func) == "model.get_submodule"]
    assert targets == [escape]  # the module's name, whole, as data


@pytest.mark.parametrize("before", [(False, False), (True, False), (True, True)])
def test_a_deterministic_scope_puts_back_the_process_flags_as_they_were(before):
    """The study's scopes run in the caller's process (`numparity_agent.testing`, a user's
    workload): leaving one restores torch's two flags, warn-only included (it was left on,
    so a later `doctor` in that process warned of start-up code that did not exist)."""
    saved = (torch.are_deterministic_algorithms_enabled(),
             torch.is_deterministic_algorithms_warn_only_enabled())
    try:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        with _determinism.Flags(["deterministic_algorithms"]).scope():
            assert torch.are_deterministic_algorithms_enabled()
            assert torch.is_deterministic_algorithms_warn_only_enabled()
        assert (torch.are_deterministic_algorithms_enabled(),
                torch.is_deterministic_algorithms_warn_only_enabled()) == before
    finally:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
