"""End-to-end runs of the real cnn workload in child processes (design §2.3, §2.7)."""

import json

import pytest
from helpers.agent import clean_env, run_agent

from numparity_agent.testing import main

LAYERS = ["conv1", "relu1", "pool1", "conv2", "relu2", "pool2", "flatten", "fc1", "relu3", "fc2"]


def tensor_hashes(result: dict) -> dict[str, str]:
    return {t["name"]: t["hash"] for t in result["tensors"]}


def test_output_writes_a_run_document_with_both_variants(cnn_document):
    doc = cnn_document
    assert doc["schema"] == "numparity.run/v1"
    assert doc["node"] == {"name": "node-a", "labels": {"rack": "b2"}}
    assert doc["agent_version"] == "0.1.0" and doc["drill"] is False
    assert doc["started_at"].endswith("Z") and doc["finished_at"] >= doc["started_at"]
    assert len(doc["environment"]["env_key"]) == 64
    assert [(r["workload"], r["variant"], r["status"]) for r in doc["results"]] == [
        ("cnn", "default", "ok"),
        ("cnn", "strict", "ok"),
    ]
    for result in doc["results"]:
        assert result["suite"] == "standard" and result["workload_version"] == 1
        assert result["device"] == "cpu" and result["repeats"] == 2
        assert [t["name"] for t in result["tensors"]] == LAYERS + ["output"]
        assert [t["order"] for t in result["tensors"]] == list(range(11))
        assert {t["kind"] for t in result["tensors"][:-1]} == {"layer"}
        output = result["tensors"][-1]
        assert output["kind"] == "output" and output["shape"] == [64, 10]
        assert output["stats"]["count"] == 640 and "values" in output
        # Repeats 2: the first warms up, the second is the time; no spread from one.
        assert result["wall_s"] == result["wall_s_repeats"][1] > 0
        assert "wall_s_spread" not in result
    default, strict = doc["results"]
    assert default["input_hash"] == strict["input_hash"]
    assert default["param_hash"] == strict["param_hash"]
    assert strict["knobs"]["deterministic_algorithms"] is True
    assert strict["knobs"]["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert default["knobs"]["deterministic_algorithms"] is False
    # The environment describes the node, not the strict child's additions.
    assert "CUBLAS_WORKSPACE_CONFIG" not in doc["environment"]["env_vars"]
    assert doc["environment"]["threads"]["num_threads"] == 2
    # No GPU here: the default device, every visible GPU, is the CPU.
    (cpu,) = doc["devices"]
    assert {k: v for k, v in cpu.items() if k != "wall_s"} == {
        "device": "cpu", "type": "cpu", "index": None, "uuid": None, "serial": None,
        "pci_bus_id": None, "name": doc["environment"]["cpu"]["model"],
        "compute_capability": None, "mig": False, "status": "ok",
    }
    assert cpu["wall_s"] > sum(r["wall_s"] * r["repeats"] for r in doc["results"])
    assert "drill_device" not in doc


@pytest.mark.parametrize(("times", "expected"), [
    ([5.0], {"wall_s": 5.0}),
    ([9.0, 1.0], {"wall_s": 1.0}),
    ([9.0, 1.0, 3.0, 2.0], {"wall_s": 2.0, "wall_s_spread": 1.0}),
    ([0.1, 0.25, 0.75], {"wall_s": 0.5, "wall_s_spread": 0.25}),
])
def test_the_wall_time_is_the_median_after_the_warm_up_with_half_the_range(times, expected):
    from numparity_agent._runner import wall_time

    assert wall_time(times) == expected


def test_strict_repeats_agree(cnn_document):
    strict = cnn_document["results"][1]
    assert strict["repeats_agree"] is True and "repeats_differ" not in strict


@pytest.fixture(scope="module")
def probes_document(tmp_path_factory):
    """`probes` under default with the node's 2 threads, one repeat (a few seconds)."""
    out = tmp_path_factory.mktemp("probes") / "doc.json"
    proc = run_agent(
        "run", "--workloads", "probes", "--variants", "default", "--repeats", "1",
        "--output", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text())


def test_one_thread_changes_long_sums_but_not_inputs(cnn_document, probes_document, tmp_path):
    out = tmp_path / "one-thread.json"
    proc = run_agent(
        "run", "--workloads", "cnn", "probes", "--variants", "default", "--repeats", "1",
        "--output", str(out), env=clean_env(OMP_NUM_THREADS="1"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    one = json.loads(out.read_text())
    one_cnn, one_probes = one["results"]
    two_cnn, two_probes = cnn_document["results"][0], probes_document["results"][0]
    assert (one_cnn["workload"], one_probes["workload"]) == ("cnn", "probes")
    for one_result, two_result in ((one_cnn, two_cnn), (one_probes, two_probes)):
        assert one_result["status"] == "ok", one_result.get("error")
        assert one_result["input_hash"] == two_result["input_hash"]
        assert one_result["param_hash"] == two_result["param_hash"]
    # ATen's own parallel sum splits the 2**20 elements by thread count on any CPU.
    # Whether MKL's sgemm does depends on the CPU and the shape (cnn's fc1 and output:
    # yes on a Xeon with AMX, no on an AMD EPYC; train's fc2 weight gradient, 128x10
    # with K=64: yes on the EPYC), so no gemm result is asserted here.
    one_hashes, two_hashes = tensor_hashes(one_probes), tensor_hashes(two_probes)
    assert one_hashes["sum_long"] != two_hashes["sum_long"]
    assert one_hashes["cumsum"] == two_hashes["cumsum"]  # a scan is sequential on the CPU
    env = one["environment"]
    assert env["threads"]["num_threads"] == 1
    assert env["env_vars"] == {"OMP_NUM_THREADS": "1"}
    assert env["env_key"] != cnn_document["environment"]["env_key"]
    assert probes_document["environment"]["env_key"] == cnn_document["environment"]["env_key"]


def test_mkl_cbwr_compatible_changes_fc1_and_output(cnn_document, tmp_path):
    out = tmp_path / "cbwr.json"
    proc = run_agent(
        "run", "--workloads", "cnn", "--variants", "default", "--repeats", "1",
        "--output", str(out), env=clean_env(MKL_CBWR="COMPATIBLE"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    cbwr = json.loads(out.read_text())
    cbwr_hashes = tensor_hashes(cbwr["results"][0])
    node_hashes = tensor_hashes(cnn_document["results"][0])
    assert cbwr["results"][0]["input_hash"] == cnn_document["results"][0]["input_hash"]
    assert cbwr_hashes["conv1"] == node_hashes["conv1"]
    assert cbwr_hashes["fc1"] != node_hashes["fc1"]
    assert cbwr_hashes["output"] != node_hashes["output"]
    assert cbwr["environment"]["env_vars"] == {"MKL_CBWR": "COMPATIBLE"}


def test_unknown_variant_is_a_usage_error_listing_valid_names(capsys):
    assert main(["run", "--variants", "default,bogus"]) == 2
    err = capsys.readouterr().err
    assert "bogus" in err and "default" in err and "strict" in err


def test_unknown_workload_is_a_usage_error_listing_valid_names(capsys):
    assert main(["run", "--workloads", "resnet"]) == 2
    err = capsys.readouterr().err
    assert "resnet" in err and "cnn" in err


def test_a_crashing_variant_is_reported_and_the_other_kept(tmp_path):
    out = tmp_path / "doc.json"
    proc = run_agent(
        "run",
        "--workloads",
        "agent_test_workloads:crash_in_strict",
        "--variants",
        "default",
        "strict",
        "--repeats",
        "1",
        "--output",
        str(out),
    )
    assert proc.returncode == 4, proc.stderr
    doc = json.loads(out.read_text())
    default, strict = doc["results"]
    assert default["variant"] == "default" and default["status"] == "ok"
    assert [t["name"] for t in default["tensors"]] == ["linear", "output"]
    assert strict["variant"] == "strict" and strict["status"] == "failed"
    assert "SIGABRT" in strict["error"]
    assert doc["environment"]["env_key"]


def test_a_hanging_variant_times_out(tmp_path):
    out = tmp_path / "doc.json"
    proc = run_agent(
        "run",
        "--workloads",
        "agent_test_workloads:hang_in_strict",
        "--variants",
        "strict",
        "--repeats",
        "1",
        "--timeout",
        "6",
        "--output",
        str(out),
    )
    assert proc.returncode == 4, proc.stderr
    doc = json.loads(out.read_text())
    (strict,) = doc["results"]
    assert strict["status"] == "failed" and "timed out after 6 s" in strict["error"]
    # No variant delivered an environment: it was captured by a separate child.
    assert doc["environment"]["threads"]["num_threads"] == 2


def test_strict_turns_reduced_precision_off(cnn_document):
    knobs = cnn_document["results"][1]["knobs"]
    assert knobs["float32_matmul_precision"] == "highest"
    assert knobs["cudnn.deterministic"] is True and knobs["cudnn.benchmark"] is False
    for name in (
        "cuda.matmul.fp32_precision",
        "cudnn.conv.fp32_precision",
        "mkldnn.matmul.fp32_precision",
    ):
        if name in knobs:  # torch >= 2.9 has the fp32_precision tree
            assert knobs[name] == "ieee"
    assert knobs["num_threads"] == 2
