"""Issue 28's checks on this machine's GPU (tools/gpu_check.py, run once for the module:
the agent from the checkout, the embedded server on SQLite): every row must be ok.
Skipped without CUDA (tests/gpu/conftest.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from helpers.gpu_check import load


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    gpu_check = load()
    if os.environ.get(gpu_check.FAKE_ENV):
        pytest.skip("tests/gpu is for a real GPU: unset NUMPARITY_GPU_CHECK_FAKE")
    work = Path(tmp_path_factory.mktemp("gpu-check"))
    check = gpu_check.Check(work, device=os.environ.get("NUMPARITY_GPU_CHECK_DEVICE",
                                                        "cuda:0"),
                            workloads=list(gpu_check.STANDARD), fake=False)
    found = {row.check: row for row in gpu_check.run_checks(check)}
    print(gpu_check.table(list(found.values()), "numparity gpu-check (tests/gpu)"))
    return found


def _ok(rows: dict[str, Any], name: str) -> Any:
    row = rows[name]
    assert row.status == "ok", f"{name}: {row.status}: {row.detail}"
    return row


def test_the_gpu_is_identified_by_nvml(rows):
    data = _ok(rows, "identity").data
    assert data["uuid"].startswith(("GPU-", "MIG-")) and data["compute_capability"]


def test_every_variant_runs_on_the_gpu(rows):
    _ok(rows, "variants")


def test_a_variant_costs_at_most_3_s_and_fingerprinting_at_most_10_percent(rows):
    _ok(rows, "variant overhead")


def test_turning_tf32_off_splits_cnn_names_the_variable_and_leaves_mlp(rows):
    assert _ok(rows, "TF32 split").data["split"] is True


def test_explain_finds_the_tf32_setting(rows):
    assert _ok(rows, "explain").data["status"] == "reproduced"


def test_the_fused_sdpa_backends_run_in_half_precision(rows):
    probes = _ok(rows, "SDPA backends").data["probes"]
    for dtype in ("float16", "bfloat16"):
        for backend in ("flash", "efficient", "math"):
            assert probes[f"{backend}/{dtype}"]["ran"], (backend, dtype, probes)


def test_the_collectives_run_over_nccl(rows):
    assert _ok(rows, "NCCL collectives").data["backend"] == "nccl"


def test_traces_name_cuda_kernels_at_most_1_3_times_the_untraced_cost(rows):
    data = _ok(rows, "profiler kernel names").data
    assert data["named"] > 0 and data["ratio"] <= 1.3 and data["trace_errors"] == 0


def test_the_large_suite_uploads_whole(rows):
    _ok(rows, "large-suite upload")


def test_the_judge_calls_boundary_pairs_as_cuda_isclose_does(rows):
    row = rows["CUDA isclose"]
    if row.status == "n/a":
        pytest.skip(row.detail)
    assert _ok(rows, "CUDA isclose").data["differing"] == 0


def test_the_compiled_variant_runs_on_the_gpu_and_the_server_judges_it(rows):
    data = _ok(rows, "compiled").data
    assert data["verdict"] in ("identical", "equivalent", "divergent")
    assert data["compile"]["warm_s"] is not None
