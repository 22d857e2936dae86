"""Splits between devices of one environment are named (issue 28).

A host's GPU and its CPU share an environment, as do two GPU models of one node: no
environment attribute tells their answers apart, and /divergence and the workload page
said "—". The split is attributed to the device (type, model, compute capability), and
two groups computed on CUDA devices only are judged in CUDA's isclose arithmetic.
"""

from __future__ import annotations

import copy
from typing import Any

from helpers.documents import A100, cnn_tensors, gpu_document, rekey

H100 = {"name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0"}


def host(node: str, *, cpu: bool = True, second: dict[str, str] | None = None
         ) -> dict[str, Any]:
    """One strict cnn run of a node: its A100 at cuda:0 and its CPU (the CPU's answer
    shifted: another device computes otherwise), or with ``second`` a second GPU of
    another model at cuda:1 (its answer shifted), instead of the CPU."""
    uuids = [f"{node}-gpu0"] + ([f"{node}-gpu1"] if second else [])
    document = gpu_document(node, 1, uuids)
    (gpu,) = [r for r in document["results"] if r["device"] == "cuda:0"]
    document["results"] = [gpu]
    if second:
        document["devices"][1].update(second)
        document["environment"]["gpus"][1].update(second)
        rekey(document["environment"])
        document["results"].append({**copy.deepcopy(gpu), "device": "cuda:1",
                                    "tensors": cnn_tensors(2e-3)})
    if cpu:
        document["devices"].append({"device": "cpu", "type": "cpu", "index": None,
                                    "name": "Xeon", "status": "ok", "wall_s": 1.0})
        document["results"].append({**copy.deepcopy(gpu), "device": "cpu",
                                    "tensors": cnn_tensors(1e-3)})
    return document


def divergence(api: Any) -> dict[str, Any]:
    answer = api.client.get("/api/v1/divergence", headers=api.reader,
                            params={"workload": "cnn", "variant": "strict"})
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_a_hosts_gpu_and_cpu_split_is_attributed_to_the_device(api):
    for node in ("host-1", "host-2", "host-3"):
        assert api.post_run(host(node)).status_code == 201
    report = divergence(api)
    assert len({g["env_keys"][0] for g in report["groups"]}) == 1  # one environment
    assert [g["size"] for g in report["groups"]] == [3, 3]
    (pair,) = report["pairs"]
    named = {item["attribute"]: (item["a"], item["b"]) for item in pair["attribution"]}
    assert list(named)[0] == "device.type", pair["attribution"]
    assert sorted(named["device.type"]) == [["cpu"], ["cuda"]]
    assert named["device.model"] in ((["NVIDIA A100-SXM4-80GB"], ["unset"]),
                                     (["unset"], ["NVIDIA A100-SXM4-80GB"]))
    assert "device.compute_capability" in named
    # The fleet-wide ranking names the device too, as the best predictor of the group.
    assert report["attribution"][0]["attribute"] == "device.type"
    assert report["attribution"][0]["conditional_entropy"] == 0.0
    # A GPU judged against a CPU: the CPU's isclose arithmetic.
    assert pair["semantics"] == "cpu"

    page = api.client.get("/workloads/cnn", headers=api.reader).text
    assert "device.type" in page and "no environment or device attribute" not in page


def test_two_gpu_models_of_one_node_are_told_apart_and_judged_as_on_the_cpu(api):
    """Two devices' answers are compared as assert_close compares tensors on two
    devices: on the CPU (issue 42, 13)."""
    for node in ("mixed-1", "mixed-2"):
        assert api.post_run(host(node, cpu=False, second=H100)).status_code == 201
    report = divergence(api)
    (pair,) = report["pairs"]
    named = {item["attribute"]: sorted([*item["a"], *item["b"]])
             for item in pair["attribution"]}
    assert named == {"device.model": sorted([A100["name"], H100["name"]]),
                     "device.compute_capability": ["8.0", "9.0"]}
    assert pair["semantics"] == "cpu"
