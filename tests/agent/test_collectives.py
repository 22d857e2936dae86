"""The `collectives` workload (design §2.2): real gloo ranks on this machine, judged
against inputs rebuilt from the portable generator and a numpy float64 sum; the NCCL
path with a fake GPU count and NCCL at the edge; a crashing or hung rank."""

import dataclasses
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
import torch.distributed as dist
from helpers.agent import run_agent

from numparity_agent import _rng
from numparity_agent._workloads import collectives
from numparity_agent._workloads.collectives import (
    GATHER,
    LENGTH,
    WORLD_CPU,
    Plan,
    RankAnswer,
    RankTask,
    plan_for,
    run_ranks,
)
from numparity_agent.testing import (
    Recorder,
    builtin_workloads,
    load_workload,
    run_workload,
    variant,
)

CPU = torch.device("cpu")
NAMES = ["all_reduce.w4", "all_gather.w4", "reduce_scatter.w4"]
# Every rank's answers are recorded (version 2): rank 0's under NAMES, rank r's after.
RECORDED = NAMES + [f"{name}.rank{rank}" for rank in range(1, 4) for name in NAMES] + [
    f"{name}{f'.rank{rank}' if rank else ''}.repeat{k}"
    for rank in range(4) for name in NAMES for k in (1, 2)]
# The name under which torch (2.13 and later, else before) offers the one-tensor all-gather.
ALL_GATHER = "all_gather_single" if hasattr(dist, "all_gather_single") else "all_gather_into_tensor"


def portable_inputs() -> list[np.ndarray]:
    """Each rank's float32 input, from the generator itself (not the workload's build)."""
    return [
        _rng.bell(0, f"standard/collectives/v2/input.rank{rank}", (LENGTH,))
        for rank in range(WORLD_CPU)
    ]


def run_in(variant_name: str, workload=None) -> Recorder:
    """One run of the workload under the variant (its dtype, device and autocast)."""
    workload = workload or load_workload("collectives")
    chosen = variant(variant_name)
    device = chosen.target_device(CPU)
    built = workload.build(dtype=chosen.dtype(), device=device)
    recorder = Recorder()
    with chosen.run_context(device):
        workload.run(built, recorder)
    return recorder


def tensors(recorder: Recorder) -> dict[str, torch.Tensor]:
    return {name: value for name, _kind, value in recorder.tensors}


@pytest.fixture(scope="module")
def runs() -> dict[str, Recorder]:
    return {name: run_in(name) for name in ("default", "fp16-autocast", "bf16-autocast",
                                            "fp64-reference")}


@pytest.fixture(scope="module")
def answers() -> list[RankAnswer]:
    """Every rank's answer to the float32 inputs."""
    plan = plan_for(CPU)
    assert isinstance(plan, Plan)
    return run_ranks(plan, portable_inputs(), torch.float32, timeout_s=60)


def test_collectives_run_by_default_in_the_standard_suite():
    assert "collectives" in builtin_workloads()
    workload = load_workload("collectives")
    assert (workload.suite, workload.name, workload.version) == ("standard", "collectives", 2)


@pytest.mark.parametrize(
    ("variant_name", "dtype"),
    [("default", np.float32), ("fp16-autocast", np.float16), ("fp64-reference", np.float64)],
)
def test_the_all_reduce_is_the_float64_sum_within_the_reported_ulps(runs, variant_name, dtype):
    fields = runs[variant_name].fields["collectives"]
    xs = np.stack([x.astype(dtype) for x in portable_inputs()]).astype(np.float64)
    exact = np.sum(xs, axis=0)
    result = tensors(runs[variant_name])["all_reduce.w4"].numpy()
    assert result.dtype == dtype and fields["dtype"] == np.dtype(dtype).name
    ulps = np.testing.assert_array_max_ulp(
        result, exact.astype(dtype), maxulp=fields["all_reduce_max_ulp"]
    )
    assert ulps.max() == fields["all_reduce_max_ulp"]
    assert np.count_nonzero(ulps) == fields["all_reduce_not_correctly_rounded"]
    error = np.abs(result.astype(np.float64) - exact)
    assert error.max() == fields["all_reduce_max_abs_error"]
    # Whatever the order of its world-1 additions, a sum in `dtype` is within this bound.
    unit, adds = np.finfo(dtype).eps / 2, WORLD_CPU - 1
    assert np.all(error <= adds * unit / (1 - adds * unit) * np.abs(xs).sum(axis=0))
    if dtype == np.float64:  # these inputs' sums are exact in float64
        assert fields["all_reduce_max_ulp"] == 0
    else:  # the reduction order shows: some elements are not the correctly rounded sum
        assert fields["all_reduce_not_correctly_rounded"] > 0


def test_the_bfloat16_all_reduce_is_within_the_bound_of_its_additions(runs):
    fields = runs["bf16-autocast"].fields["collectives"]
    result = tensors(runs["bf16-autocast"])["all_reduce.w4"]
    assert result.dtype == torch.bfloat16 and fields["dtype"] == "bfloat16"
    xs = np.stack([torch.from_numpy(x).bfloat16().double().numpy() for x in portable_inputs()])
    exact = xs.sum(axis=0)
    error = np.abs(result.double().numpy() - exact)
    assert error.max() == fields["all_reduce_max_abs_error"] > 0
    unit, adds = 2.0**-8, WORLD_CPU - 1
    assert np.all(error <= adds * unit / (1 - adds * unit) * np.abs(xs).sum(axis=0))


def test_the_fields_say_what_ran_and_what_held(runs):
    recorder = runs["default"]
    assert [(name, kind) for name, kind, _value in recorder.tensors] == [
        (name, "output") for name in RECORDED
    ]
    shapes = {name: tuple(value.shape) for name, value in tensors(recorder).items()}
    assert shapes == {name: {"all_reduce": (LENGTH,), "all_gather": (WORLD_CPU * GATHER,),
                             "reduce_scatter": (LENGTH // WORLD_CPU,)}[name.split(".")[0]]
                      for name in RECORDED}
    # Honest repeats are their first answer, bit for bit.
    for name, value in tensors(recorder).items():
        if ".repeat" in name:
            first = tensors(recorder)[name.rsplit(".repeat", 1)[0]]
            assert torch.equal(value.view(torch.int32), first.view(torch.int32)), name
    # Each rank's reduce-scatter is its own share of the sum of the inputs (float64, then
    # rounded once: within float32's additions of it), and every rank's all-gather is the
    # inputs' heads exactly.
    xs = portable_inputs()
    exact = np.sum(np.stack(xs).astype(np.float64), axis=0)
    share = LENGTH // WORLD_CPU
    heads = np.concatenate([x[:GATHER] for x in xs])
    for rank in range(WORLD_CPU):
        suffix = f".rank{rank}" if rank else ""
        found = tensors(recorder)
        np.testing.assert_allclose(found[f"reduce_scatter.w4{suffix}"].numpy(),
                                   exact[rank * share:(rank + 1) * share], rtol=1e-5,
                                   atol=1e-5)
        assert np.array_equal(found[f"all_gather.w4{suffix}"].numpy().view(np.uint32),
                              heads.view(np.uint32))
    fields = recorder.fields["collectives"]
    assert fields["backend"] == "gloo" and fields["world_size"] == WORLD_CPU == 4
    assert fields["repeats"] == 3
    assert fields["settings"] == {"GLOO_SOCKET_IFNAME": "lo"}
    for run in runs.values():
        held = run.fields["collectives"]
        assert held["repeats_agree"] is held["ranks_agree"] is True
        assert held["all_gather_exact"] is held["reduce_scatter_matches_all_reduce"] is True
        assert "repeats_differ" not in held and "skipped" not in held


def test_every_rank_gets_the_same_all_reduce_and_the_inputs_gathered_bitwise(answers):
    gathered = np.concatenate([x[:GATHER] for x in portable_inputs()])
    for answer in answers:
        assert np.array_equal(answer.bits["all_reduce"], answers[0].bits["all_reduce"])
        assert np.array_equal(answer.bits["all_gather"], gathered.view(np.int32))


def test_each_ranks_reduce_scatter_is_its_slice_of_the_all_reduce_bitwise(answers):
    share = LENGTH // WORLD_CPU
    total = answers[0].bits["all_reduce"]
    for rank, answer in enumerate(answers):
        assert np.array_equal(answer.bits["reduce_scatter"], total[rank * share:(rank + 1) * share])


def test_gloo_repeats_are_bitwise_equal_within_a_run_and_across_runs(answers):
    assert all(answer.repeats_differ == [] for answer in answers)
    plan = plan_for(CPU)
    assert isinstance(plan, Plan)
    again = run_ranks(plan, portable_inputs(), torch.float32, timeout_s=60)
    for first, second in zip(answers, again, strict=True):
        for name in first.bits:
            assert np.array_equal(first.bits[name], second.bits[name]), name


def test_ranks_started_as_for_cuda_give_the_same_answers(answers):
    """The start method the NCCL path uses (a forkserver), exercised with gloo."""
    plan = plan_for(CPU)
    assert isinstance(plan, Plan)
    served = dataclasses.replace(plan, start_method="forkserver")
    for first, second in zip(
        answers, run_ranks(served, portable_inputs(), torch.float32, timeout_s=60), strict=True
    ):
        assert first.bits.keys() == second.bits.keys()
        for name in first.bits:
            assert np.array_equal(first.bits[name], second.bits[name]), name


def test_a_repeat_that_differs_is_reported(monkeypatch):
    real = dist.all_reduce
    calls = []

    def second_call_differs_on_rank_1(tensor, *args, **kwargs):
        calls.append(1)  # each forked rank counts its own calls
        work = real(tensor, *args, **kwargs)
        if len(calls) == 2 and dist.get_rank() == 1:
            tensor[0] += 1
        return work

    monkeypatch.setattr(dist, "all_reduce", second_call_differs_on_rank_1)
    fields = run_in("default").fields["collectives"]
    assert fields["repeats_agree"] is False and fields["repeats_differ"] == ["all_reduce"]
    assert fields["ranks_agree"] is True  # the recorded (first) repeat is the same everywhere


def test_a_collective_the_backend_cannot_run_in_the_dtype_is_skipped_with_the_reason(monkeypatch):
    def unsupported(*_args, **_kwargs):
        raise RuntimeError("Invalid scalar type")

    monkeypatch.setattr(dist, ALL_GATHER, unsupported)
    recorder = run_in("bf16-autocast")
    fields = recorder.fields["collectives"]
    assert fields["skipped"] == {
        "all_gather": f"gloo on torch {torch.__version__} cannot all_gather bfloat16: "
                      "Invalid scalar type"
    }
    assert list(tensors(recorder)) == [name for name in RECORDED
                                       if not name.startswith("all_gather")]
    assert "all_gather_exact" not in fields and fields["reduce_scatter_matches_all_reduce"]


def test_any_other_error_of_a_collective_fails_the_workload(monkeypatch):
    def broken(*_args, **_kwargs):
        raise RuntimeError("the transport broke")

    monkeypatch.setattr(dist, ALL_GATHER, broken)
    result = run_workload(load_workload("collectives"), variant=variant("default"),
                          device=CPU, repeats=1)
    assert result["status"] == "failed"
    # Every rank raises alike; whichever said so first is named.
    assert re.fullmatch(
        r"numparity_agent\._workloads\.collectives\.CollectiveError: collectives over 4 gloo "
        r"ranks failed: rank \d: RuntimeError: the transport broke \(ranks [\d, ]+ failed too\)",
        result["error"].splitlines()[0],
    )


def rank_2_does(monkeypatch, action) -> None:
    real = collectives._collectives

    def misbehaving(task, device):
        if task.rank == 2:
            action()
        return real(task, device)

    monkeypatch.setattr(collectives, "_collectives", misbehaving)


def test_a_crashing_rank_fails_the_workload_at_once_naming_it(monkeypatch):
    rank_2_does(monkeypatch, lambda: os._exit(3))
    started = time.monotonic()
    result = run_workload(load_workload("collectives"), variant=variant("default"),
                          device=CPU, repeats=1)
    assert time.monotonic() - started < 15
    assert result["status"] == "failed"
    assert result["error"].splitlines()[0] == (
        "numparity_agent._workloads.collectives.CollectiveError: collectives over 4 gloo "
        "ranks failed: rank 2 exited with code 3 without an answer (ranks 0, 1, 3 failed too)"
    )
    assert multiprocessing.active_children() == []


def test_a_rank_that_raises_is_named_before_the_peers_that_lost_it(monkeypatch):
    def boom():
        raise ValueError("boom in rank 2")

    rank_2_does(monkeypatch, boom)
    result = run_workload(load_workload("collectives"), variant=variant("default"),
                          device=CPU, repeats=1)
    assert result["status"] == "failed"
    assert "failed: rank 2: ValueError: boom in rank 2" in result["error"].splitlines()[0]
    assert 'raise ValueError("boom in rank 2")' in result["error"]  # the rank's traceback


def test_a_hung_rank_is_killed_at_the_timeout_and_named(monkeypatch):
    rank_2_does(monkeypatch, lambda: time.sleep(600))
    workload = load_workload("collectives")
    workload.timeout_s = 4.0
    started = time.monotonic()
    result = run_workload(workload, variant=variant("default"), device=CPU, repeats=1)
    assert time.monotonic() - started < 15
    assert result["status"] == "failed"
    first = result["error"].splitlines()[0]
    assert "failed: rank 2 had not answered 1 s after another rank failed (killed)" in first
    assert "Timed out" in result["error"]  # what its peers said: gloo's own timeout
    assert multiprocessing.active_children() == []


# A variant child whose ranks all hang: it prints their pids once they have started.
HUNG_VARIANT_CHILD = """
import os, sys, time, torch
from numparity_agent._workloads import collectives
from numparity_agent._workloads._base import Recorder

def hang(task, device):
    open(os.path.join(sys.argv[1], str(os.getpid())), "w").close()
    time.sleep(600)

collectives._collectives = hang
workload = collectives.Collectives()
workload.run(workload.build(dtype=torch.float32, device=torch.device("cpu")), Recorder())
"""


@pytest.mark.skipif(sys.platform != "linux", reason="the kernel's parent-death signal")
def test_no_rank_outlives_a_variant_child_killed_at_its_timeout(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", HUNG_VARIANT_CHILD, str(tmp_path)])
    try:
        deadline = time.monotonic() + 60
        while len(os.listdir(tmp_path)) < WORLD_CPU and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        child.kill()  # what the agent does to a variant child at --timeout
        child.wait()
    ranks = [int(name) for name in os.listdir(tmp_path)]
    assert len(ranks) == WORLD_CPU
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in ranks) and time.monotonic() < deadline:
        time.sleep(0.05)
    survivors = [pid for pid in ranks if alive(pid)]
    for pid in survivors:  # leave nothing behind, even when failing
        os.kill(pid, signal.SIGKILL)
    assert survivors == []


def alive(pid: int) -> bool:
    """Running (a zombie no init has reaped yet is dead)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_the_fault_drill_leaves_the_collectives_untouched():
    strict = variant("strict")
    before = run_workload(load_workload("collectives"), variant=strict, device=CPU, repeats=1)
    after = run_workload(load_workload("collectives"), variant=strict, device=CPU, repeats=1,
                         fault_drill=True)
    assert "drill" not in after
    timings = ("wall_s", "wall_s_repeats", "timeline")
    assert {k: v for k, v in after.items() if k not in timings} == {
        k: v for k, v in before.items() if k not in timings
    }


# The NCCL path, with the GPUs and NCCL faked at the edge.


def fake_gpus(monkeypatch, count: int) -> None:
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: (2, 21, 5))
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)


def test_on_cuda_the_ranks_are_every_visible_gpu_under_nccl_with_its_settings(monkeypatch):
    fake_gpus(monkeypatch, 8)
    monkeypatch.setenv("NCCL_ALGO", "Tree")
    monkeypatch.delenv("NCCL_PROTO", raising=False)
    plan = plan_for(torch.device("cuda", 3))
    assert plan == Plan(
        backend="nccl", world=8, start_method="forkserver",
        settings={"NCCL_ALGO": "Tree", "NCCL_PROTO": None, "nccl_version": "2.21.5"},
    )


def test_without_nccl_or_a_backend_the_collectives_are_skipped(monkeypatch):
    fake_gpus(monkeypatch, 2)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: False)
    assert plan_for(torch.device("cuda", 0)) == f"torch {torch.__version__} has no NCCL"
    workload = load_workload("collectives")
    recorder = Recorder()
    workload.run(workload.build(dtype=torch.float32, device=torch.device("meta")), recorder)
    reason = "no torch.distributed backend for device type meta (NCCL: cuda, gloo: cpu)"
    assert recorder.tensors == []
    assert recorder.fields["collectives"] == {
        "skipped": dict.fromkeys(("all_reduce", "all_gather", "reduce_scatter"), reason)
    }


def test_an_nccl_rank_takes_its_own_gpu_and_meets_the_others_at_the_file_store(
    monkeypatch, tmp_path
):
    seen: dict = {}
    monkeypatch.setattr(collectives, "_die_with_parent", lambda: None)  # not this process
    monkeypatch.setattr(torch, "set_num_threads", lambda n: seen.update(threads=n))
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: seen.update(device=device))
    monkeypatch.setattr(
        dist, "init_process_group", lambda backend, **kw: seen.update(backend=backend, **kw)
    )
    monkeypatch.setattr(dist, "destroy_process_group", lambda: seen.update(destroyed=True))
    monkeypatch.setattr(collectives, "_collectives",
                        lambda task, device: RankAnswer({}, [], {"ran on": str(device)}))
    plan = Plan("nccl", 8, "forkserver", {})
    store = str(tmp_path / "store")
    task = RankTask(5, plan, "bfloat16", np.zeros(4, np.float32), store, timeout_s=100.0)
    answer = collectives._rank_answer(task)
    assert answer.skipped == {"ran on": "cuda:5"}
    assert seen["device"] == torch.device("cuda", 5)
    assert (seen["backend"], seen["rank"], seen["world_size"]) == ("nccl", 5, 8)
    assert seen["init_method"] == f"file://{store}"
    assert seen["timeout"].total_seconds() == 75.0  # below the parent's 100 s deadline
    assert seen["destroyed"] is True and seen["threads"] == 1


def test_through_the_cli_the_collectives_run_in_their_variant_child(tmp_path):
    out = tmp_path / "doc.json"
    proc = run_agent("run", "--workloads", "collectives", "--variants", "default",
                     "fp64-reference", "--repeats", "2", "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    results = {r["variant"]: r for r in json.loads(out.read_text())["results"]}
    for name, dtype in (("default", "float32"), ("fp64-reference", "float64")):
        result = results[name]
        assert result["status"] == "ok" and result["repeats_agree"] is True, result.get("error")
        assert [(t["name"], t["kind"], t["dtype"]) for t in result["tensors"]] == [
            (tensor, "output", dtype) for tensor in RECORDED
        ]
        assert result["collectives"]["backend"] == "gloo"
