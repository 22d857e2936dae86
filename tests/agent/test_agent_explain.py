"""`numparity-agent explain` (design §2.11): candidates, the search, and real children
that find this CPU's settings.

The real differences are found on the machine the tests run on (a setting that changes
nothing here skips its test); the search is checked against a fake child where the
answer is known by construction.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers.agent import clean_env, run_agent

from numparity_agent import _explain
from numparity_agent._settings import Setting

LOCAL = {"env_vars": {}, "threads": {"num_threads": 2}, "cpu": {"logical_cpus": 2},
         "knobs": {"mkldnn.enabled": True, "float32_matmul_precision": "highest",
                   "deterministic_algorithms": False, "cudnn.benchmark": False},
         "torch": {"mkl_available": True}}


def test_the_differences_between_the_environments_come_first() -> None:
    reference = {**LOCAL, "env_vars": {"MKL_CBWR": "COMPATIBLE", "CUBLAS_WORKSPACE_CONFIG":
                                       ":4096:8"},
                 "threads": {"num_threads": 1},
                 "knobs": {**LOCAL["knobs"], "float32_matmul_precision": "medium",
                           "cudnn.benchmark": True}}
    local = {**LOCAL, "env_vars": {"ATEN_CPU_CAPABILITY": "avx2"}}
    pool = _explain.candidates(reference, local, "cpu", limit=500)
    labels = [s.label() for s in pool]
    # What differs and applies to a CPU, first: the reference's variables (unset where
    # it has none), thread count, knobs. CUDA's settings never, on a CPU.
    assert labels[:4] == ["MKL_CBWR=COMPATIBLE", "ATEN_CPU_CAPABILITY unset", "threads=1",
                          "float32_matmul_precision=medium"]
    assert not any("CUBLAS" in label or "cudnn" in label or "tf32" in label.lower()
                   for label in labels)
    # Never the node as it is, never a setting twice, singles before pairs, and a pair
    # never sets one thing twice.
    assert "as configured" not in labels and len(labels) == len(set(labels))
    sizes = [s.size for s in pool]
    assert sizes == sorted(sizes) and max(sizes) == 2
    assert all(len({name for name, _ in s.env} | {name for name, _ in s.knobs}) == s.size
               for s in pool)
    assert len(_explain.candidates(reference, local, "cpu", limit=7)) == 7


def test_on_a_gpu_the_cuda_settings_are_candidates_and_mkl_is_not() -> None:
    labels = [s.label() for s in _explain.candidates(LOCAL, LOCAL, "cuda", limit=500)
              if s.size == 1]
    assert {"CUBLAS_WORKSPACE_CONFIG=:4096:8", "NVIDIA_TF32_OVERRIDE=0",
            "cuda.matmul.allow_tf32=false", "cudnn.deterministic=true", "sdpa=cudnn",
            "cudnn.benchmark=true"} <= set(labels)
    assert not any(label.startswith(("MKL_CBWR", "ATEN_CPU_CAPABILITY", "threads",
                                     "mkldnn")) for label in labels)
    # A torch with the fp32_precision tree gets TF32 candidates of that API only (the
    # legacy getters raise once it is used).
    new_api = {**LOCAL, "knobs": {**LOCAL["knobs"], "cuda.matmul.fp32_precision": "none"}}
    labels = {s.label() for s in _explain.candidates(LOCAL, new_api, "cuda", limit=500)}
    assert "cuda.matmul.fp32_precision=tf32" in labels
    assert not any("allow_tf32" in label for label in labels)


# ---- the search, against a fake child whose answers are known ---------------------------

REFERENCE_TENSORS = (("fc1", "a" * 64), ("output", "b" * 64))


def _target(workload: str = "mlp") -> _explain.Target:
    return _explain.Target(suite="standard", workload=workload, workload_version=1,
                           variant="default", device="cpu", tensors=REFERENCE_TENSORS,
                           input_hash="i", param_hash="p")


class FakeChild:
    """A node that gives the reference's bits exactly under `answer`, and under `near`
    the reference's fc1 only."""

    def __init__(self, answer: Setting | None, near: Setting | None = None,
                 inputs: str = "i") -> None:
        self.answer, self.near, self.inputs = answer, near, inputs
        self.calls: list[tuple[Setting, list[Setting]]] = []

    def __call__(self, env: Setting, variant: str, workloads: list[str],
                 knob_sets: list[Setting], stop_when: Any, timeout: float) -> dict[str, Any]:
        self.calls.append((env, knob_sets))
        evaluations = []
        for index, knobs in enumerate(knob_sets):
            setting = Setting(env=env.env, knobs=knobs.knobs)
            tensors = [["fc1", "c" * 64], ["output", "d" * 64]]
            if setting == self.answer:
                tensors = [list(p) for p in REFERENCE_TENSORS]
            elif setting == self.near:
                tensors = [["fc1", "a" * 64], ["output", "d" * 64]]
            evaluations += [{"candidate": index, "workload": w, "status": "ok",
                             "tensors": tensors, "input_hash": self.inputs,
                             "param_hash": "p"} for w in workloads]
        return {"environment": {**LOCAL, "env_vars": {"MKL_CBWR": "AUTO"}},
                "evaluations": evaluations}


def test_the_first_setting_that_gives_every_tensor_is_the_finding() -> None:
    answer = Setting.of(env={"ATEN_CPU_CAPABILITY": "avx2"})
    child = FakeChild(answer)
    reference = {"environment": {**LOCAL, "env_vars": {"MKL_CBWR": "AUTO"}}}
    explained = _explain.explain(reference, [_target()], runner=child, log_line=print)
    (finding,) = explained.findings
    assert finding.status == "reproduced" and finding.setting == answer
    # The node as configured first, then candidates until the answer, not beyond.
    assert child.calls[0] == (Setting(), [Setting()])
    assert child.calls[-1][0] == answer
    assert finding.tried == sum(len(sets) for _env, sets in child.calls[1:])


def test_without_a_setting_the_closest_is_named_and_the_budget_holds() -> None:
    near = Setting.of(knobs={"threads": 1})
    child = FakeChild(None, near)
    (finding,) = _explain.explain({"environment": {}}, [_target()], runner=child,
                                  max_candidates=12, log_line=print).findings
    assert finding.status == "not_reproduced" and finding.tried == 12
    assert finding.closest == {"label": "threads=1", "setting": near.to_json(),
                               "matching": 1, "tensors": 2, "first_differing": "output"}
    assert "no single setting or pair reproduces" in finding.sentence("r1")


def test_other_inputs_are_not_a_setting() -> None:
    (finding,) = _explain.explain({"environment": {}}, [_target()],
                                  runner=FakeChild(None, inputs="other"),
                                  log_line=print).findings
    assert finding.status == "failed" and "broken inputs" in finding.detail


def test_targets_are_the_reference_results_asked_for() -> None:
    results = [{"workload": w, "variant": v, "device": d, "status": "ok",
                "tensors": [{"name": "output", "hash": "e" * 64}]}
               for w, v, d in (("mlp", "default", "cpu"), ("mlp", "fp64-reference", "cpu"),
                               ("cnn", "strict", "cuda:1"), ("cnn", "strict", "cuda:0"))]
    reference = {"run_id": "r1", "results": results}
    chosen = _explain.targets_of(reference, workloads=None, variants=None, device=None)
    assert [(t.workload, t.variant) for t in chosen] == [("mlp", "default"), ("cnn", "strict")]
    assert [t.device for t in _explain.on_device(
        _explain.targets_of(reference, workloads=["cnn"], variants=None, device=None) +
        [_explain.Target("standard", "cnn", 1, "strict", "cuda:0", ())], "cuda:0")] == ["cuda:0"]
    with pytest.raises(_explain.ExplainError, match="no ok result of workloads lstm"):
        _explain.targets_of(reference, workloads=["lstm"], variants=None, device=None)


# ---- real children on this CPU ----------------------------------------------------------


def _reference(path: Path) -> dict[str, Any]:
    """What the server's reference route answers for the run in `path`."""
    document = json.loads(path.read_text())
    env = document["environment"]
    return {"run_id": document["run_id"],
            "environment": {k: env[k] for k in ("env_vars", "threads", "knobs", "cpu",
                                                "torch")},
            "results": [{**{k: r[k] for k in ("suite", "workload", "workload_version",
                                               "variant", "device", "status", "input_hash",
                                               "param_hash")},
                         "tensors": [{"name": t["name"], "hash": t["hash"]}
                                     for t in r["tensors"]]}
                        for r in document["results"] if r["status"] == "ok"]}


def _run(tmp_path: Path, name: str, **env: str) -> Path:
    out = tmp_path / f"{name}.json"
    proc = run_agent("run", "--workloads", "mlp", "probes", "--variants", "default",
                     "--repeats", "1", "--output", str(out), env=clean_env(**env))
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("explain")
    return {"stock": _run(tmp, "stock"), "mkl": _run(tmp, "mkl", MKL_CBWR="COMPATIBLE")}


def _differs(a: Path, b: Path) -> bool:
    hashes = [{t["hash"] for r in json.loads(p.read_text())["results"] for t in r["tensors"]}
              for p in (a, b)]
    return hashes[0] != hashes[1]


@pytest.mark.parametrize("here, against, expected", [
    ({}, "mkl", "MKL_CBWR=COMPATIBLE"), ({"MKL_CBWR": "COMPATIBLE"}, "stock", "MKL_CBWR unset")])
def test_real_children_find_the_mkl_setting_in_both_directions(
        runs, monkeypatch, here, against, expected) -> None:
    if not _differs(runs["stock"], runs["mkl"]):
        pytest.skip("MKL_CBWR=COMPATIBLE changes no bit of mlp or probes on this CPU")
    for name, value in clean_env(**here).items():
        monkeypatch.setenv(name, value)
    for name in ("MKL_CBWR",):
        if name not in here:
            monkeypatch.delenv(name, raising=False)
    reference = _reference(runs[against])
    targets = _explain.targets_of(reference, workloads=None, variants=None, device=None)
    explained = _explain.explain(reference, targets, log_line=print)
    findings = explained.findings
    assert explained.env_key is not None and len(explained.env_key) == 64
    differing = [f for f in findings if f.status != "already"]
    assert differing and {f.setting.label() for f in differing} == {expected}
    assert all(f.status == "reproduced" and f.tried == 1 for f in differing)


def test_a_knob_set_is_in_force_for_its_block_and_taken_back() -> None:
    import torch

    from numparity_agent._settings import NotApplicable, knobs_in_force

    def state() -> tuple[Any, ...]:
        return (torch.get_num_threads(), torch.backends.mkldnn.enabled,
                torch.get_float32_matmul_precision(),
                torch.are_deterministic_algorithms_enabled())

    before = state()
    wanted = (1, False, "medium", True)
    with knobs_in_force({"threads": 1, "mkldnn.enabled": False,
                         "float32_matmul_precision": "medium",
                         "deterministic_algorithms": True, "sdpa": "math"}):
        assert state() == wanted
        q = torch.ones(1, 1, 4, 8)
        # Only the math backend may run: a fused kernel's op does not appear.
        from numparity_agent._trace import OpTracer
        with OpTracer() as tracer:
            torch.nn.functional.scaled_dot_product_attention(q, q, q)
        assert not any("flash" in op["op"] for op in tracer.ops)
    assert state() == before
    with pytest.raises(NotApplicable), knobs_in_force({"cuda.no_such.knob": True}):
        pass


def test_a_compiled_explain_child_compiles_into_the_nodes_compile_cache(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    import subprocess

    from numparity_agent import _explain
    from numparity_agent._settings import Setting

    seen: list[dict[str, str]] = []

    def fake_run(cmd: list[str], *, env: dict[str, str], **_: Any) -> Any:
        seen.append(env)
        return subprocess.CompletedProcess(cmd, 1, "", "stopped here")

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setattr(_explain.subprocess, "run", fake_run)
    _explain.run_explain_child(Setting(), "compiled", ["mlp"], [Setting()], {}, 5.0,
                               compile_cache=tmp_path / "inductor")
    _explain.run_explain_child(Setting(), "default", ["mlp"], [Setting()], {}, 5.0,
                               compile_cache=tmp_path / "inductor")
    assert seen[0]["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "inductor")
    assert "TORCHINDUCTOR_CACHE_DIR" not in seen[1]  # an eager child compiles nothing


def test_the_deterministic_knob_leaves_torchs_warn_only_flag_as_it_was() -> None:
    """A process whose own code runs deterministic algorithms warn-only (off, or on) gets
    both flags back after the knob's block, and the block changes the one it names."""
    import torch

    from numparity_agent._settings import knobs_in_force

    def flags() -> tuple[bool, bool]:
        return (torch.are_deterministic_algorithms_enabled(),
                torch.is_deterministic_algorithms_warn_only_enabled())

    before = flags()
    try:
        for start in ((False, True), (True, True)):
            torch.use_deterministic_algorithms(start[0], warn_only=start[1])
            with knobs_in_force({"deterministic_algorithms": not start[0]}):
                assert flags() == (not start[0], True)
            assert flags() == start
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def test_the_cuda_knobs_are_set_and_taken_back_where_torch_has_them() -> None:
    """The GPU's settings (no GPU here: the flags exist in every torch build; what they
    change on a GPU is unverified on this machine)."""
    import torch

    from numparity_agent._settings import knobs_in_force

    cudnn = torch.backends.cudnn
    before = (cudnn.deterministic, cudnn.benchmark)
    with knobs_in_force({"cudnn.deterministic": True, "cudnn.benchmark": True}):
        assert (cudnn.deterministic, cudnn.benchmark) == (True, True)
    assert (cudnn.deterministic, cudnn.benchmark) == before
    matmul: Any = torch.backends.cuda.matmul
    name = "fp32_precision" if hasattr(matmul, "fp32_precision") else "allow_tf32"
    value = "tf32" if name == "fp32_precision" else True
    previous = getattr(matmul, name)
    with knobs_in_force({f"cuda.matmul.{name}": value}):
        assert getattr(matmul, name) == value
    assert getattr(matmul, name) == previous
