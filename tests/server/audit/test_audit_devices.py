"""The audit judges each GPU of a node on its own (issue 18): a node's identical GPUs are
each other's peers, a suspect is named by node, slot and UUID, a GPU's history follows
its UUID to another node, and a node whose GPU was replaced is no longer suspect for it."""

from __future__ import annotations

import pytest
from helpers.documents import gpu_document

from numparity_server.kit.db import get_engine, session_factory
from numparity_server.runs import moves

GPUS = [f"GPU-{i:08d}-aaaa-bbbb-cccc-{i:012d}" for i in range(8)]
BAD = GPUS[3]


def upload(api, document):
    response = api.client.post("/api/v1/runs", json=document, headers=api.agent)
    assert response.status_code in (200, 201), response.text


def audit(api):
    response = api.client.get("/api/v1/audit", headers=api.reader)
    assert response.status_code == 200, response.text
    return response.json()


def test_one_gpu_of_an_eight_gpu_node_is_suspect_and_its_siblings_are_not(api):
    """A lab with a single 8-GPU node: its GPUs are 8 peers; the one that computes wrong
    in two runs is suspect, named by node, slot, UUID and serial."""
    for hours in (3, 2):
        upload(api, gpu_document("gpu-node-17", hours, GPUS, shifted={BAD: 1e-3}, drill=True))
    report = audit(api)
    (entry,) = report["suspects"]
    assert (entry["node"], entry["device"], entry["device_uuid"], entry["status"]) == \
        ("gpu-node-17", "cuda:3", BAD, "suspect")
    assert entry["device_serial"] == f"serial-{BAD}"
    assert entry["device_pci_bus_id"] == "00000000:03:00.0"
    assert entry["peers"] == 7 and entry["majority_nodes"] == 7
    assert entry["disagreeing_runs"] == 2 and entry["drill_runs"] == 2
    assert entry["detail"].startswith(f"gpu-node-17 / cuda:3 (NVIDIA A100-SXM4-80GB, UUID {BAD}")
    assert entry["detail"].endswith("disagrees with 7 identical peers in 2 runs")
    assert report["summary"]["suspect"] == 1 and report["summary"]["nodes"] == 1
    assert (report["summary"]["devices"], report["summary"]["suspect_devices"],
            report["summary"]["watched_devices"]) == (8, 1, 0)
    metrics = api.client.get("/metrics", headers=api.reader).text
    assert 'numparity_devices{status="suspect"} 1.0' in metrics
    assert 'numparity_devices{status="all"} 8.0' in metrics
    # Its compare link compares it with a sibling GPU of the same run.
    link = entry["compare"]
    assert link["run_a"] == link["run_b"] and link["device_b"] == "cuda:3"
    assert link["device_a"] != "cuda:3"
    compared = api.client.get("/api/v1/compare", headers=api.reader, params={
        key: link[key] for key in ("run_a", "run_b", "device_a", "device_b")}).json()
    (pair,) = compared["pairs"]
    assert pair["summary"]["result_verdict"]["verdict"] != "identical"
    missing = api.client.get("/api/v1/compare", headers=api.reader, params={
        "run_a": link["run_a"], "run_b": link["run_b"], "device_a": "cuda:9"})
    assert missing.status_code == 404 and "cuda:0" in missing.json()["detail"]


@pytest.mark.parametrize("new_node_first", [False, True])
def test_a_moved_gpu_keeps_its_history_and_its_old_node_is_cleared(api, new_node_first):
    """Whichever of the two nodes reports first after the move."""
    for hours in (5, 4):
        upload(api, gpu_document("gpu-a", hours, GPUS, shifted={BAD: 1e-3}))
    assert [e["node"] for e in audit(api)["suspects"]] == ["gpu-a"]
    # The bad GPU is swapped for a new one: gpu-a no longer sees its UUID. It shows up
    # in gpu-b, at cuda:0, computing right this time.
    replacement = "GPU-99999999-aaaa-bbbb-cccc-999999999999"
    swapped = [replacement if u == BAD else u for u in GPUS]
    others = [f"GPU-{i:08d}-dddd-eeee-ffff-{i:012d}" for i in range(7)]
    repaired, moved = gpu_document("gpu-a", 3, swapped), gpu_document("gpu-b", 2, [BAD, *others])
    if new_node_first:
        upload(api, moved)
    upload(api, repaired)
    if not new_node_first:
        report = audit(api)
        assert report["suspects"] == [] and report["summary"]["suspect"] == 0
        upload(api, moved)
    # The GPU belongs to gpu-a, which reported it first: gpu-b's report of it is a claim
    # (issue 29) until an admin confirms the move (`numparity-server device move`).
    assert BAD not in {d["uuid"] for d in api.client.get(
        "/api/v1/nodes/gpu-b", headers=api.reader).json()["devices"]}
    with session_factory(get_engine(api.settings))() as session:
        moves.move_device(session=session, device=BAD, to_node="gpu-b")
    # Its two disagreeing runs come with it (within the window): suspect there, not now
    # disagreeing; gpu-a is clear.
    (entry,) = audit(api)["suspects"]
    assert (entry["node"], entry["device"], entry["device_uuid"]) == ("gpu-b", "cuda:0", BAD)
    assert entry["status"] == "suspect" and entry["currently_disagrees"] is False
    # Its move is drift of the device: from gpu-a to gpu-b, its answer changed with it.
    (move,) = [row for row in audit(api)["drift"] if row["device"]]
    assert (move["node"], move["device"], move["device_uuid"], move["previous_node"]) == \
        ("gpu-b", "cuda:0", BAD, "gpu-a")
    assert move["attributes"] == []  # identical environments
    assert [(c["workload"], c["variant"], c["device"]) for c in move["outputs_changed"]] == \
        [("cnn", "strict", "cuda:0")]
    node = api.client.get("/api/v1/nodes/gpu-a", headers=api.reader).json()
    assert BAD not in {d["uuid"] for d in node["devices"]}
    assert replacement in {d["uuid"] for d in node["devices"]}


def test_a_device_not_described_by_the_document_is_refused(api):
    document = gpu_document("gpu-c", 1, GPUS[:2])
    document["results"][1]["device"] = "cuda:7"
    response = api.client.post("/api/v1/runs", json=document, headers=api.agent)
    assert response.status_code == 422
    assert "cuda:7" in response.text


def test_divergence_names_each_gpu_of_a_split_by_node_and_slot(api):
    upload(api, gpu_document("gpu-d", 1, GPUS[:4], shifted={GPUS[2]: 1e-3}))
    response = api.client.get("/api/v1/divergence", headers=api.reader,
                              params={"workload": "cnn", "variant": "strict"})
    assert response.status_code == 200, response.text
    groups = response.json()["groups"]
    assert [group["size"] for group in groups] == [3, 1]
    assert groups[0]["nodes"] == ["gpu-d"] * 3
    assert groups[1]["devices"] == [{"node": "gpu-d", "device": "cuda:2"}]
    assert groups[1]["representative"]["device"] == "cuda:2"


def test_a_gpu_whose_uuid_changed_on_its_node_is_the_same_device_by_its_serial(api):
    """A virtual machine renumbers a GPU: same board serial, new UUID, same node. Its
    history stays with it; another node claiming that serial takes nothing."""
    for hours in (5, 4):
        upload(api, gpu_document("vm-1", hours, GPUS, shifted={BAD: 1e-3}))
    renumbered = "GPU-77777777-aaaa-bbbb-cccc-777777777777"
    document = gpu_document("vm-1", 3, [renumbered if u == BAD else u for u in GPUS])
    document["devices"][3]["serial"] = f"serial-{BAD}"
    document["environment"]["gpus"][3]["serial"] = f"serial-{BAD}"
    upload(api, document)
    (entry,) = audit(api)["suspects"]
    assert (entry["node"], entry["device"], entry["device_uuid"]) == \
        ("vm-1", "cuda:3", renumbered)
    assert entry["disagreeing_runs"] == 2 and entry["currently_disagrees"] is False
    # A node elsewhere claims the same serial under yet another UUID: a device of its own.
    intruder = gpu_document("other", 2, ["GPU-66666666-aaaa-bbbb-cccc-666666666666"])
    intruder["devices"][0]["serial"] = f"serial-{BAD}"
    upload(api, intruder)
    (entry,) = audit(api)["suspects"]
    assert (entry["node"], entry["device_uuid"]) == ("vm-1", renumbered)


def node_devices(api, node):
    response = api.client.get(f"/api/v1/nodes/{node}", headers=api.reader)
    assert response.status_code == 200, response.text
    return {d["uuid"] for d in response.json()["devices"]}


def test_a_run_given_one_gpu_by_a_scheduler_leaves_the_nodes_other_gpus_where_they_are(api):
    """A Slurm job's agent sees one GPU (CUDA_VISIBLE_DEVICES=1): its environment and
    devices list that GPU only, and NVML's list of the node's GPUs (`node_gpus`) says
    the others are still in it — none leaves the node. An agent that sends no such list
    (older) is judged as before: what the run did not see has left (issue 42)."""
    upload(api, gpu_document("gpu-e", 3, GPUS[:4]))
    assert node_devices(api, "gpu-e") == set(GPUS[:4])
    allocated = gpu_document("gpu-e", 2, [GPUS[1]])
    allocated["node_gpus"] = GPUS[:4]
    upload(api, allocated)
    assert node_devices(api, "gpu-e") == set(GPUS[:4])
    upload(api, gpu_document("gpu-e", 1, [GPUS[1]]))
    assert node_devices(api, "gpu-e") == {GPUS[1]}
