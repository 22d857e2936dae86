"""`make gpu-check`'s rules, in-process: each step under its deadline (a hang, a process
past its deadline, an exception each become a FAIL saying so, the steps after it still
run and print), and what the rows expect of a GPU (issue 42: 3, 6, 8)."""

from __future__ import annotations

import contextlib
import subprocess
import threading
from pathlib import Path

import pytest
from helpers.gpu_check import load

gpu_check = load()


@pytest.fixture
def quick(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """A check whose server is not started and whose steps are the test's, each with a
    deadline of 1 s."""
    monkeypatch.setattr(gpu_check.Check, "embedded_server",
                        lambda self: contextlib.nullcontext())
    monkeypatch.setattr(gpu_check, "DEADLINES_S", {name: 1 for name in gpu_check.ROWS})
    monkeypatch.setattr(gpu_check, "HANG_GRACE_S", 0.1)
    return gpu_check.Check(tmp_path, device="cuda:0", workloads=["mlp"], fake=True)


def test_a_hung_step_fails_its_rows_and_the_next_ones_still_run_and_print(quick, monkeypatch):
    release = threading.Event()
    Row, Step = gpu_check.Row, gpu_check.Step

    def hangs(check):
        release.wait(30)  # a CUDA call that never returns
        return []

    def times_out(check):
        raise subprocess.TimeoutExpired(["numparity-agent", "run"], check.remaining())

    def raises(check):
        raise RuntimeError("NVML: Unknown Error")

    monkeypatch.setattr(gpu_check, "steps", lambda: [
        Step(["identity"], lambda c: [Row("identity", "ok", "fake")], needs_server=False),
        Step(["variants", "variant overhead"], hangs),
        Step(["TF32 split"], times_out),
        Step(["explain"], raises),
        Step(["SDPA backends"], lambda c: [Row("SDPA backends", "ok", "ran")]),
    ])
    printed: list[str] = []
    try:
        rows = gpu_check.run_checks(quick, on_row=lambda r: printed.append(r.check))
    finally:
        release.set()
    by_name = {r.check: r for r in rows}
    assert printed == ["identity", "variants", "variant overhead", "TF32 split", "explain",
                       "SDPA backends"]
    assert by_name["variants"].status == "FAIL"
    assert "no answer after 1 s" in by_name["variant overhead"].detail
    assert by_name["TF32 split"].status == "FAIL"
    assert "past its deadline of 1 s" in by_name["TF32 split"].detail
    assert by_name["explain"].detail == "RuntimeError: NVML: Unknown Error"
    assert by_name["SDPA backends"].status == "ok"


def test_past_the_checks_deadline_the_remaining_rows_say_they_did_not_run(quick, monkeypatch):
    Row, Step = gpu_check.Row, gpu_check.Step
    monkeypatch.setattr(gpu_check, "steps", lambda: [
        Step(["identity"], lambda c: [Row("identity", "ok", "fake")], needs_server=False),
        Step(["CUDA isclose"], lambda c: [Row("CUDA isclose", "ok", "0")], needs_server=False),
    ])
    rows = gpu_check.run_checks(quick, deadline_s=0)
    assert [(r.check, r.status) for r in rows] == [("identity", "ok"), ("CUDA isclose", "n/a")]
    assert "the check's deadline (0 s) passed" in rows[1].detail


def test_a_step_that_stops_at_its_first_row_says_what_it_did_not_measure(quick, monkeypatch):
    Row, Step = gpu_check.Row, gpu_check.Step
    monkeypatch.setattr(gpu_check, "steps", lambda: [
        Step(["variants", "variant overhead"], lambda c: [Row("variants", "FAIL", "exit 3")],
             needs_server=False)])
    rows = gpu_check.run_checks(quick)
    assert [(r.check, r.status) for r in rows] == [("variants", "FAIL"),
                                                    ("variant overhead", "n/a")]
    assert rows[1].detail == "not measured: variants FAIL"


@pytest.mark.parametrize(("dtype", "cc", "expected"), [
    # Flash attention takes float16/bfloat16 only: the decoder's float32 never uses it.
    ("float32", (9, 0), {"efficient", "math"}),
    ("float16", (9, 0), {"flash", "efficient", "math"}),
    ("bfloat16", (8, 0), {"flash", "efficient", "math"}),
    ("float16", (7, 5), {"efficient", "math"}),  # flash needs sm80
])
def test_the_sdpa_row_expects_the_backends_that_take_the_dtype(dtype, cc, expected):
    assert gpu_check.sdpa_expected(dtype, cc) == expected


def test_the_kernel_name_row_never_traces_a_workload_with_atomics():
    chosen = gpu_check.trace_workloads(list(gpu_check.STANDARD))
    assert "probes" not in chosen and "collectives" not in chosen
    assert chosen == ["mlp", "cnn", "transformer"]
    assert gpu_check.TRACE_VARIANT == "strict"


def test_the_mig_row_names_an_instance_nvml_shows_that_all_does_not(quick, monkeypatch):
    """NVML (the fake's, in the row's own child) shows two instances of a GPU in MIG
    mode: a listing that has both is ok, one that has the first only (what CUDA alone
    shows a process) fails naming the other (issue 42, 11)."""
    from helpers.agent import fake_gpu, fake_gpu_env

    board = fake_gpu(0, mig_mode=True)
    instances = [{"uuid": f"MIG-00000000-0000-4000-8000-00000000000{n}",
                  "parent": board["uuid"], "name": "NVIDIA H200 MIG 3g.71gb", "cc": "9.0"}
                 for n in range(2)]
    env = fake_gpu_env([board, *instances])
    monkeypatch.setattr(gpu_check.Check, "agent_env", lambda self, **extra: env)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    quick.all_devices = [{"device": f"cuda:{n}", "uuid": i["uuid"], "mig": True}
                         for n, i in enumerate(instances)]
    row = gpu_check.check_mig(quick)
    assert row.status == "ok", row.detail
    assert row.detail.startswith("2 instance(s) on 1 GPU(s) in MIG mode")
    quick.all_devices = quick.all_devices[:1]
    row = gpu_check.check_mig(quick)
    assert row.status == "FAIL" and row.detail.endswith(f"not listed: {instances[1]['uuid']}")
    monkeypatch.setattr(gpu_check.Check, "agent_env",
                        lambda self, **extra: fake_gpu_env([fake_gpu(0)]))
    row = gpu_check.check_mig(quick)
    assert row.status == "n/a" and "no GPU in MIG mode among NVML's 1" in row.detail
    # The stock run's node_gpus must be NVML's whole list.
    quick.documents["stock"] = {"node_gpus": []}
    row = gpu_check.check_mig(quick)
    assert row.status == "FAIL" and "node_gpus [] is not NVML's" in row.detail
