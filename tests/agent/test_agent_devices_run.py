"""A run on a node with several (fake) GPUs: each device in turn, one document.

The GPUs are the fakes of tests/helpers/fake_cuda: each computes on this CPU in the
agent's real child processes, with its own thread count (a real numeric difference), or
crashes its children. Two runs are shared by the tests: `node_run`, the CLI with no
--device on a node of three GPUs, and `drill_run`, run_suite on three of four GPUs, one
crashing, with a fault drill on another.
"""

import json
import os
import re
from collections import Counter

import pytest
import torch
from helpers.agent import fake_gpu, fake_gpu_env, run_agent

from numparity_agent import _devices
from numparity_agent.testing import load_workload, run_suite, run_workload, variant

# What NVML reads on cuda:0 (issue 44); the others answer Not Supported, as consumer
# boards do.
TELEMETRY = {"temperature_c": 83, "sm_clock_mhz": 1410, "memory_clock_mhz": 1593,
             "power_w": 312.5, "ecc_corrected_volatile": 7, "ecc_uncorrected_volatile": 0,
             "ecc_corrected_aggregate": 41, "ecc_uncorrected_aggregate": 1,
             "remapped_rows": [2, 1, False, False]}
# The node's two threads on cuda:0 and cuda:1; cuda:2 computes with one.
NODE_GPUS = [fake_gpu(0, telemetry=TELEMETRY), fake_gpu(1), fake_gpu(2, threads=1)]
WORKLOADS = ["mlp", "probes"]
CPU = torch.device("cpu")


def by_device(document: dict) -> dict[str, dict[tuple[str, str], dict]]:
    found: dict[str, dict[tuple[str, str], dict]] = {}
    for result in document["results"]:
        found.setdefault(result["device"], {})[(result["workload"], result["variant"])] = result
    return found


def hashes(result: dict) -> dict[str, str]:
    return {t["name"]: t["hash"] for t in result["tensors"]}


@pytest.fixture(scope="module")
def node_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpus") / "doc.json"
    proc = run_agent("run", "--workloads", *WORKLOADS, "--variants", "default", "strict",
                     "fp64-reference", "--repeats", "1", "--node", "gpu-node-17",
                     "--output", str(out), env=fake_gpu_env(NODE_GPUS), timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stderr, json.loads(out.read_text())


@pytest.fixture(scope="module")
def drill_run():
    """run_suite in this process (its children see the fake GPUs through the
    environment): cuda:0, cuda:1 and cuda:3 of four, cuda:3 crashing, the drill on
    cuda:1. Returns the document, the log lines and the progress texts."""
    gpus = [fake_gpu(0), fake_gpu(1), fake_gpu(2), fake_gpu(3, crash=True)]
    logs: list[str] = []
    shown: list[str] = []
    env = fake_gpu_env(gpus)
    with pytest.MonkeyPatch.context() as patch:
        for key in list(os.environ):
            patch.delenv(key)
        for key, value in env.items():
            patch.setenv(key, value)
        # This process has no fake GPU driver of its own (its children do).
        patch.setattr(_devices, "gpu_driver_present", lambda: True)
        document = run_suite(
            workloads=["mlp"], variants=["strict"], device="cuda:0,cuda:1,cuda:3",
            repeats=1, drill=True, drill_device="cuda:1", log_line=logs.append,
            on_progress=lambda _done, _total, what: shown.append(what),
        )
    return document, logs, shown


def test_each_gpu_has_nvmls_readings_at_the_start_and_the_end(node_run):
    _log, document = node_run
    telemetry = {d["device"]: d.get("telemetry") for d in document["devices"]}
    expected = {**{k: v for k, v in TELEMETRY.items() if k != "remapped_rows"},
                "remapped_rows_corrected": 2, "remapped_rows_uncorrected": 1,
                "remap_pending": False, "remap_failed": False}
    assert telemetry["cuda:0"] == {"start": expected, "end": expected}
    # Boards NVML reads nothing of, and the CPU, carry none: nothing is guessed.
    assert telemetry["cuda:1"] is None and telemetry["cuda:2"] is None
    assert telemetry["cpu"] is None


def test_no_device_option_runs_every_gpu_and_lists_each(node_run):
    _log, document = node_run
    devices = document["devices"]
    assert [d["device"] for d in devices] == ["cuda:0", "cuda:1", "cuda:2", "cpu"]
    for index, (entry, gpu) in enumerate(zip(devices, NODE_GPUS, strict=False)):
        assert {k: v for k, v in entry.items() if k not in ("wall_s", "telemetry")} == {
            "device": f"cuda:{index}", "type": "cuda", "index": index, "uuid": gpu["uuid"],
            "serial": gpu["serial"], "pci_bus_id": gpu["pci_bus_id"],
            "name": "NVIDIA A100-SXM4-80GB", "compute_capability": "8.0", "mig": False,
            "status": "ok",
        }
    cpu = devices[-1]
    assert (cpu["type"], cpu["index"], cpu["uuid"], cpu["status"]) == ("cpu", None, None, "ok")
    results = by_device(document)
    assert set(results) == {d["device"] for d in devices}
    for slot in ("cuda:0", "cuda:1", "cuda:2"):
        assert set(results[slot]) == {(w, v) for w in WORKLOADS for v in ("default", "strict")}
        assert {r["status"] for r in results[slot].values()} == {"ok"}
        # The device's total covers the wall time of its children's workloads.
        entry = next(d for d in devices if d["device"] == slot)
        assert entry["wall_s"] > sum(r["wall_s"] for r in results[slot].values())
    keys = Counter((r["suite"], r["workload"], r["variant"], r["device"])
                   for r in document["results"])
    assert max(keys.values()) == 1


def test_the_float64_reference_runs_once_on_the_cpu(node_run):
    _log, document = node_run
    reference = [r for r in document["results"] if r["variant"] == "fp64-reference"]
    assert [(r["workload"], r["device"], r["status"]) for r in reference] == [
        (w, "cpu", "ok") for w in WORKLOADS]
    assert set(by_device(document)["cpu"]) == {(w, "fp64-reference") for w in WORKLOADS}


def test_identical_gpus_agree_and_a_one_thread_gpu_differs_as_a_one_thread_cpu(node_run):
    """The oracle: each workload recomputed in this process with 2 threads, then 1."""
    _log, document = node_run
    results = by_device(document)
    expected: dict[int, dict[str, dict[str, str]]] = {}
    node_threads = torch.get_num_threads()
    try:
        for threads in (2, 1):
            torch.set_num_threads(threads)
            expected[threads] = {
                w: hashes(run_workload(load_workload(w), variant=variant("default"),
                                       device=CPU, repeats=1))
                for w in WORKLOADS
            }
    finally:
        torch.set_num_threads(node_threads)
    differing = {(w, name) for w in WORKLOADS for name, h in expected[1][w].items()
                 if expected[2][w][name] != h}
    assert differing, "one thread and two give the same bits here: no difference to see"
    for workload in WORKLOADS:
        for slot, threads in (("cuda:0", 2), ("cuda:1", 2), ("cuda:2", 1)):
            assert hashes(results[slot][(workload, "default")]) == expected[threads][workload]
        for name in ("default", "strict"):
            assert results["cuda:0"][(workload, name)]["tensors"] == (
                results["cuda:1"][(workload, name)]["tensors"])


def test_log_lines_name_the_device(node_run):
    log, document = node_run
    assert re.search(r"numparity-agent: cuda:2 variant default: probes ok in ", log)
    assert "numparity-agent: cpu variant fp64-reference: running mlp, probes\n" in log
    uuid = NODE_GPUS[1]["uuid"]
    assert re.search(rf"device cuda:1 \(NVIDIA A100-SXM4-80GB, {uuid}\): done in [\d.]+ s\n",
                     log)


def test_a_crashing_gpu_fails_its_own_results_only(drill_run):
    document, logs, _shown = drill_run
    assert [(d["device"], d["status"]) for d in document["devices"]] == [
        ("cuda:0", "ok"), ("cuda:1", "ok"), ("cuda:3", "failed")]
    assert document["devices"][2]["uuid"] == fake_gpu(3)["uuid"]
    results = by_device(document)
    assert set(results) == {"cuda:0", "cuda:1", "cuda:3"}  # cuda:2 was not asked for
    (crashed,) = results["cuda:3"].values()
    assert crashed["status"] == "failed" and "SIGABRT" in crashed["error"]
    assert results["cuda:0"][("mlp", "strict")]["status"] == "ok"
    assert any(line.startswith("device cuda:3 ") and line.endswith("every result failed")
               for line in logs)


def test_the_drill_corrupts_the_drill_device_only(drill_run, node_run):
    document, logs, _shown = drill_run
    assert document["drill"] is True and document["drill_device"] == "cuda:1"
    results = by_device(document)
    clean, drilled = results["cuda:0"][("mlp", "strict")], results["cuda:1"][("mlp", "strict")]
    assert "drill" not in clean and drilled["drill"]["layer"] == "fc2"
    # cuda:0 computes what the same GPU computes without a drill (node_run's cuda:0).
    _log, undrilled = node_run
    assert clean["tensors"] == by_device(undrilled)["cuda:0"][("mlp", "strict")]["tensors"]
    assert hashes(drilled)["output"] != hashes(clean)["output"]
    assert hashes(drilled)["fc1"] == hashes(clean)["fc1"]
    assert "fault drill: one bit flipped per workload in strict on cuda:1; the document is " \
           "marked as a drill" in logs


def test_progress_names_the_device(drill_run):
    _document, _logs, shown = drill_run
    assert "cuda:1 mlp/strict" in shown and "cuda:3 strict done" in shown


def test_the_devices_run_at_once_and_the_environment_still_lists_every_gpu(node_run):
    """Every device of the node at once (issue 42, 10): the run takes about one
    device's time, not the sum of them; the environment (from a child of its own, as a
    device's child sees only its GPU) still describes every GPU the agent sees."""
    from datetime import datetime

    _log, document = node_run
    took = (datetime.fromisoformat(document["finished_at"])
            - datetime.fromisoformat(document["started_at"])).total_seconds()
    walls = [d["wall_s"] for d in document["devices"]]
    # The document's times are whole seconds: `took` is up to a second short or long.
    # At once, the run takes about the slowest device's time; one after another it
    # would take their sum.
    slowest, rest = max(walls), sum(walls) - max(walls)
    assert slowest * 0.9 - 1 <= took <= slowest + rest / 2 + 1, (walls, took)
    assert [g["name"] for g in document["environment"]["gpus"]] == [
        g["name"] for g in NODE_GPUS]


@pytest.mark.parametrize(("device", "workloads", "parent", "shown"), [
    ({"type": "cuda", "index": 1, "uuid": "GPU-aa"}, ["mlp"], None, "GPU-aa"),
    # CUDA shows one MIG instance per process: by its UUID each child sees its own.
    ({"type": "cuda", "index": 0, "uuid": "MIG-bb"}, ["mlp"], "MIG-bb,MIG-cc", "MIG-bb"),
    # Without a UUID (anonymous devices): its item of the scheduler's list.
    ({"type": "cuda", "index": 1, "uuid": None}, ["mlp"], "1,2", "2"),
    ({"type": "cuda", "index": 1, "uuid": None}, ["mlp"], None, "1"),
    # The collectives span every GPU of the node; the CPU has nothing to hide.
    ({"type": "cuda", "index": 0, "uuid": "GPU-aa"}, ["mlp", "collectives"], None, None),
    ({"type": "cpu", "index": None, "uuid": None}, ["mlp"], None, None),
])
def test_a_devices_children_see_only_that_device(device, workloads, parent, shown):
    from numparity_agent._suite import isolated_visible

    environ = {} if parent is None else {"CUDA_VISIBLE_DEVICES": parent}
    assert isolated_visible(device, workloads, environ) == shown
