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
