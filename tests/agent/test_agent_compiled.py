"""The compiled variant's parts that need no compile (design §2.14): opt-in, Inductor's
cache folder, the workloads it skips, explain's Inductor settings, repro's refusals.
What compiles is tested end to end, once, in tests/e2e/test_compiled.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers.agent import run_agent

from numparity_agent import _compile, _explain, _repro, _suite, _variants, _workloads
from numparity_agent._settings import Setting, knobs_in_force

LOCAL = {"env_vars": {}, "threads": {"num_threads": 2}, "cpu": {"logical_cpus": 2},
         "knobs": {"mkldnn.enabled": True}, "torch": {"mkl_available": True}}


def test_compiled_runs_only_when_named() -> None:
    assert "compiled" in _variants.names()
    for suite in _workloads.suite_names():
        assert "compiled" not in _suite.default_variants(suite)
    _suite.validate(["mlp"], ["default", "compiled"], 1)  # a known variant when named
    assert _variants.process_groups(["default", "compiled", "fp64-reference"], {}) == [
        ["default", "fp64-reference"], ["compiled"]]


def test_inductor_cache_lives_in_the_state_folder_unless_the_node_sets_one(
        tmp_path: Path) -> None:
    assert _compile.default_cache_dir({"XDG_STATE_HOME": str(tmp_path)}) == (
        tmp_path / "numparity" / "inductor")
    env = _compile.cache_environ({"PATH": "/bin"}, tmp_path / "cache")
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "cache")
    assert env["TORCHINDUCTOR_FX_GRAPH_CACHE"] == "1" and env["PATH"] == "/bin"
    # The node's own folder (CI's .ci/cache/inductor) is kept.
    kept = _compile.cache_environ({"TORCHINDUCTOR_CACHE_DIR": "/ci/inductor"}, tmp_path)
    assert kept["TORCHINDUCTOR_CACHE_DIR"] == "/ci/inductor"


def test_workloads_without_a_model_to_compile_are_skipped_saying_so() -> None:
    for name in ("probes", "invariance", "collectives", "data"):
        reason = _workloads.load(name).skip_reason("compiled")
        assert reason is not None and "has none to compile" in reason, name
    for name in ("mlp", "cnn", "transformer", "lstm", "train", "decoder"):
        assert _workloads.load(name).skip_reason("compiled") is None, name
    for name in ("gemm", "attention"):
        reason = _workloads.load(name, _workloads.LARGE).skip_reason("compiled")
        assert reason is not None and "has none to compile" in reason, name
    for name in ("resnet_block", "decoder", "train"):
        assert _workloads.load(name, _workloads.LARGE).skip_reason("compiled") is None


def test_explain_tries_inductor_settings_for_compiled_targets_only() -> None:
    eager = _explain.candidates(LOCAL, LOCAL, "cpu", limit=500)
    assert not any(s.compiler_only for s in eager)
    compiled = _explain.candidates(LOCAL, LOCAL, "cpu", limit=500, compiler=True)
    labels = [s.label() for s in compiled]
    # The likeliest causes of a compiled split come first.
    assert labels[0] == "inductor.emulate_precision_casts=true"
    for wanted in ("inductor.fallback_random=true", "inductor.max_autotune=true",
                   "inductor.batch_invariant=true"):
        assert wanted in labels

    seen: list[tuple[str, list[Setting]]] = []

    def child(env: Setting, variant: str, workloads: list[str], knob_sets: list[Setting],
              stop_when: Any, timeout: float) -> dict[str, Any]:
        seen.append((variant, knob_sets))
        return {"environment": LOCAL, "evaluations": []}

    targets = [_explain.Target("standard", "mlp", 1, variant, "cpu", (("output", "a"),))
               for variant in ("default", "compiled")]
    _explain.explain({"environment": LOCAL}, targets, runner=child, max_candidates=20,
                     log_line=print)
    assert any(s.compiler_only for variant, sets in seen if variant == "compiled"
               for s in sets)
    assert not any(s.compiler_only for variant, sets in seen if variant == "default"
                   for s in sets)


def test_an_inductor_knob_is_in_force_for_its_block_and_taken_back() -> None:
    from torch._inductor import config

    before = config.emulate_precision_casts
    with knobs_in_force({"inductor.emulate_precision_casts": not before}):
        assert config.emulate_precision_casts is (not before)
    assert config.emulate_precision_casts is before


def test_repro_refuses_what_it_cannot_reproduce(tmp_path: Path) -> None:
    run = {"run_id": "r1", "results": [
        {"workload": "mlp", "variant": "default", "device": "cpu", "status": "ok"},
        {"workload": "cnn", "variant": "compiled", "device": "cpu", "status": "skipped",
         "reason": "torch.compile cannot compile cnn: …"}]}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    with pytest.raises(_repro.ReproError, match="default does not compile"):
        _repro.write(path, workload="mlp", variant="default", output=None)
    with pytest.raises(_repro.ReproError, match="no result of mlp under compiled"):
        _repro.write(path, workload="mlp", variant="compiled", output=None)
    done = run_agent("repro", str(path), "--workload", "cnn", "--output",
                     str(tmp_path / "r.py"))
    assert done.returncode == 2 and "cnn/compiled is skipped in the run" in done.stderr
    assert not (tmp_path / "r.py").exists()


def test_inductor_settings_are_numeric_variables_its_cache_folder_is_not() -> None:
    from numparity_agent._knobs import numeric_env_vars

    found = numeric_env_vars({"TORCHINDUCTOR_EMULATE_PRECISION_CASTS": "1",
                              "TORCHINDUCTOR_CACHE_DIR": "/ci/inductor",
                              "TORCHINDUCTOR_FX_GRAPH_CACHE": "1"})
    assert found == {"TORCHINDUCTOR_EMULATE_PRECISION_CASTS": "1"}


# ---- explain --target eager: the Inductor setting that restores eager's bits -----------

EAGER = (("norm", "e" * 64), ("output", "f" * 64))


def _eager_reference(*, eager_device: str = "cpu") -> dict[str, Any]:
    def result(variant: str, device: str, tensors: tuple[tuple[str, str], ...]
               ) -> dict[str, Any]:
        return {"workload": "mlp", "variant": variant, "device": device, "status": "ok",
                "input_hash": "i", "param_hash": "p",
                "tensors": [{"name": n, "hash": h} for n, h in tensors]}

    return {"run_id": "r45", "environment": LOCAL, "results": [
        result("default", eager_device, EAGER),
        result("compiled", "cpu", (("norm", "c" * 64), ("output", "d" * 64))),
        result("fp64-reference", "cpu", (("norm", "9" * 64), ("output", "8" * 64)))]}


def test_the_eager_target_is_the_same_runs_default_answer_on_the_same_device() -> None:
    (target,) = _explain.eager_targets_of(_eager_reference(), workloads=None, variants=None)
    assert (target.workload, target.variant, target.device, target.kind) == (
        "mlp", "compiled", "cpu", "eager")
    assert target.tensors == EAGER
    with pytest.raises(_explain.ExplainError, match="no ok compiled result beside an ok "
                       "default result on the same device: run the agent with --variants "
                       "default compiled"):
        _explain.eager_targets_of(_eager_reference(eager_device="cuda:0"), workloads=None,
                                  variants=None)


class EagerNode:
    """A node whose eager answer is `eager` and whose compiled answer is EAGER's bits
    exactly under `restores` (None: under no setting)."""

    def __init__(self, restores: Setting | None, eager: tuple[tuple[str, str], ...] = EAGER
                 ) -> None:
        self.restores, self.eager = restores, eager
        self.calls: list[tuple[str, list[Setting]]] = []

    def __call__(self, env: Setting, variant: str, workloads: list[str],
                 knob_sets: list[Setting], stop_when: Any, timeout: float) -> dict[str, Any]:
        self.calls.append((variant, knob_sets))
        evaluations = []
        for index, knobs in enumerate(knob_sets):
            if variant == "default":
                tensors = [list(p) for p in self.eager]
            elif Setting(env=env.env, knobs=knobs.knobs) == self.restores:
                tensors = [list(p) for p in EAGER]
            else:
                tensors = [["norm", "c" * 64], ["output", "d" * 64]]
            evaluations += [{"candidate": index, "workload": w, "status": "ok",
                             "tensors": tensors, "input_hash": "i", "param_hash": "p"}
                            for w in workloads]
        knobs = {**LOCAL["knobs"], "inductor.emulate_precision_casts": False,
                 "inductor.fallback_random": False, "inductor.max_autotune": False,
                 "inductor.deterministic": False}
        return {"environment": {**LOCAL, "knobs": knobs}, "evaluations": evaluations}


def test_explain_names_the_inductor_setting_that_restores_eagers_bits() -> None:
    restores = Setting.of(knobs={"inductor.fallback_random": True})
    node = EagerNode(restores)
    targets = _explain.eager_targets_of(_eager_reference(), workloads=None, variants=None)
    (finding,) = _explain.explain({"environment": LOCAL}, targets, runner=node,
                                  log_line=print).findings
    assert finding.status == "reproduced" and finding.setting == restores
    assert finding.sentence("r45").startswith(
        "mlp/compiled: eager's bits (run r45's default result) restored by "
        "inductor.fallback_random=true (tried 2 setting(s) in ")
    # Eager as configured first, then compiled as configured, then Inductor's settings
    # only (anything else moves eager's answer too), never one as it already is.
    assert [variant for variant, _sets in node.calls] == ["default", "compiled", "compiled"]
    tried = node.calls[-1][1]
    assert all(s.compiler_only for s in tried)
    assert Setting.of(knobs={"inductor.fallback_random": False}) not in tried


def test_explain_says_when_no_candidate_restores_eagers_bits() -> None:
    targets = _explain.eager_targets_of(_eager_reference(), workloads=None, variants=None)
    (finding,) = _explain.explain({"environment": LOCAL}, targets, runner=EagerNode(None),
                                  log_line=print).findings
    sentence = finding.sentence("r45")
    assert finding.status == "not_reproduced" and finding.tried >= 4
    assert sentence.startswith("mlp/compiled: no candidate restores eager's bits (run r45's "
                               f"default result) (tried {finding.tried} in ")
    assert "inductor.emulate_precision_casts=true; inductor.fallback_random=true" in sentence
    assert "MKL" not in sentence and "threads" not in sentence


def test_explain_refuses_to_call_a_moved_eager_answer_eagers_bits() -> None:
    node = EagerNode(Setting.of(knobs={"inductor.fallback_random": True}),
                     eager=(("norm", "e" * 64), ("output", "0" * 64)))
    targets = _explain.eager_targets_of(_eager_reference(), workloads=None, variants=None)
    (finding,) = _explain.explain({"environment": LOCAL}, targets, runner=node,
                                  log_line=print).findings
    assert finding.status == "failed"
    assert "eager (default) answer is no longer the run's (1 of 2 tensors the same, first " \
           "differing output)" in finding.sentence("r45")
    assert [variant for variant, _sets in node.calls] == ["default"]


def test_explain_target_eager_refuses_a_variant_that_does_not_compile() -> None:
    done = run_agent("explain", "--against", "r45", "--target", "eager", "--variants",
                     "default", "--server", "http://127.0.0.1:9", "--token", "t")
    assert done.returncode == 2, done.stderr
    assert "--target eager explains compiled results; default does not compile (try " \
           "--variants compiled)" in done.stderr
