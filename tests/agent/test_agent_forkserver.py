"""Variant children forked from a server that imported torch once (design §2.3; issue 42,
item 7): the same results as fresh interpreters, bit for bit, and each child's own
environment in force before its torch state is touched.

The GPUs are the fakes of tests/helpers/fake_cuda (they follow CUDA_VISIBLE_DEVICES as
CUDA does, and compute on this CPU with their own thread count). One pair of runs is
shared: the same suite on two fake GPUs, once with fresh interpreters, once forked.
"""

import json
import os

import pytest
import torch
from helpers.agent import fake_gpu, fake_gpu_env

from numparity_agent import _devices, _suite
from numparity_agent._forkserver import SET_AFTER_FORK, ForkServer
from numparity_agent.testing import run_suite

# cuda:1 computes with one thread, cuda:0 with two: a real numeric difference the
# forked children must keep.
NODE_GPUS = [fake_gpu(0), fake_gpu(1, threads=1)]
WORKLOADS = ["mlp", "probes"]
VARIANTS = ["default", "strict", "fp64-reference"]


def run_on_fake_node(*, fork_server: bool):
    logs: list[str] = []
    with pytest.MonkeyPatch.context() as patch:
        for key in list(os.environ):
            patch.delenv(key)
        for key, value in fake_gpu_env(NODE_GPUS).items():
            patch.setenv(key, value)
        patch.setattr(_devices, "gpu_driver_present", lambda: True)
        document = run_suite(workloads=WORKLOADS, variants=VARIANTS, device="all",
                             repeats=1, log_line=logs.append, fork_server=fork_server)
    return document, logs


@pytest.fixture(scope="module")
def fresh_and_forked():
    return run_on_fake_node(fork_server=False), run_on_fake_node(fork_server=True)


def measured(document):
    """What each result measured: its status, every tensor's hash and the knobs."""
    return {(r["device"], r["workload"], r["variant"]): (
        r["status"], {t["name"]: t["hash"] for t in r.get("tensors", [])}, r.get("knobs"))
        for r in document["results"]}


def test_forked_children_measure_what_fresh_interpreters_measure_bit_for_bit(
        fresh_and_forked):
    (fresh, _), (forked, logs) = fresh_and_forked
    assert not [line for line in logs if "fresh interpreter" in line], logs
    expected, found = measured(fresh), measured(forked)
    assert len(expected) == len(NODE_GPUS) * len(WORKLOADS) * 2 + len(WORKLOADS)
    assert all(status == "ok" for status, _h, _k in expected.values()), fresh["results"]
    assert found == expected
    assert forked["environment"]["env_key"] == fresh["environment"]["env_key"]
    assert [d["uuid"] for d in forked["devices"]] == [d["uuid"] for d in fresh["devices"]]
    # The comparison can see a difference a server could carry over into its children
    # (a thread count): the one-thread GPU's sums are not the two-thread GPU's.
    differing = [(w, v) for (device, w, v), (_s, hashes, _k) in expected.items()
                 if device == "cuda:0" and hashes != expected[("cuda:1", w, v)][1]]
    assert differing
    strict = found[("cuda:1", "mlp", "strict")][2]
    assert strict["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"


@pytest.fixture(scope="module")
def server():
    with ForkServer(fake_gpu_env(NODE_GPUS)) as started:
        yield started


def probe(server, env, tmp_path, *, via_suite=False):
    stdout, stderr = tmp_path / "out", tmp_path / "err"
    if via_suite:
        child = _suite._start("agent_test_probe_env", ["x"], env, str(tmp_path), server)
        stdout, stderr = tmp_path / "child.stdout", tmp_path / "child.stderr"
    else:
        child = server.spawn("agent_test_probe_env", ["x"], env=env, stdout=str(stdout),
                             stderr=str(stderr))
    assert child.wait(300) == 0, stderr.read_text()
    return json.loads(stdout.read_text())


def test_a_forked_child_has_torch_and_its_own_environment_and_no_cuda_yet(server, tmp_path):
    gpu = NODE_GPUS[1]
    env = {**server.environ, "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
           "CUDA_VISIBLE_DEVICES": gpu["uuid"]}
    assert server.refuses(env) is None
    seen = probe(server, env, tmp_path)
    assert seen["torch_imported_before"] is True
    assert seen["cuda_initialised"] is False
    # As C code reads them: CUDA's driver and ATen/cuBLAS getenv them after this.
    assert seen["getenv"]["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert seen["getenv"]["CUDA_VISIBLE_DEVICES"] == gpu["uuid"]
    assert seen["devices"] == [gpu["uuid"].removeprefix("GPU-")]
    assert seen["argv"] == ["x"]
    # The next child does not inherit the last one's environment.
    plain = probe(server, dict(server.environ), tmp_path)
    assert plain["getenv"]["CUBLAS_WORKSPACE_CONFIG"] is None
    assert len(plain["devices"]) == len(NODE_GPUS)
    # Generators as in a fresh interpreter: Python's each process its own; torch's too
    # where torch seeds its CPU generator from entropy (as this process shows), else
    # its fixed default (the oracle: a new generator's first draw).
    assert seen["python_first_draw"] != plain["python_first_draw"]
    if torch.initial_seed() != torch.Generator().initial_seed():
        assert seen["torch_first_draw"] != plain["torch_first_draw"]
    else:
        fresh = torch.rand(1, generator=torch.Generator()).item()
        assert seen["torch_first_draw"] == plain["torch_first_draw"] == fresh


def test_a_setting_read_as_torch_loads_gets_a_fresh_interpreter(server, tmp_path):
    """OMP_NUM_THREADS is read when OpenMP loads, with torch: a child asking for it
    cannot be forked from a server that loaded OpenMP without it."""
    assert "OMP_NUM_THREADS" not in SET_AFTER_FORK
    env = {**server.environ, "OMP_NUM_THREADS": "1"}
    assert "OMP_NUM_THREADS" in (server.refuses(env) or "")
    seen = probe(server, env, tmp_path, via_suite=True)
    assert seen["torch_imported_before"] is False
    assert seen["torch_threads"] == 1
    assert any("OMP_NUM_THREADS" in reason for reason in server.refusals)


def test_a_wait_that_times_out_mid_line_loses_nothing_of_it():
    """The parent waits for a child's exit in short slices (its progress display): a slice
    that ends between two bytes of the supervisor's line must leave them for the next
    (a lost "{" made the line a JSON string and a stray rest)."""
    import socket
    import time

    from numparity_agent._forkserver import _Lines

    ours, theirs = socket.socketpair()
    with ours, theirs:
        lines = _Lines(ours)
        theirs.sendall(b"{")
        with pytest.raises(TimeoutError):
            lines.read(time.monotonic() + 0.05)
        theirs.sendall(b'"returncode": -6}\n{"next": 1}\n')
        assert json.loads(lines.read(time.monotonic() + 5)) == {"returncode": -6}
        assert json.loads(lines.read(time.monotonic() + 5)) == {"next": 1}
        theirs.close()
        assert lines.read(time.monotonic() + 5) is None
