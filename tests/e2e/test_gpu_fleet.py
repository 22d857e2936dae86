"""Every GPU of a node judged on its own, end to end (issue "Every GPU").

Real agents (`numparity-agent run` with no `--device`) on nodes with fake GPUs
(tests/helpers/fake_cuda: each fake GPU computes on this CPU in the agent's own child
processes) upload through `flush` to a live server:
- one run of a 4-GPU node uploads a result set per GPU, with each GPU's identity, and
  the collectives (gloo here) once;
- a fault drill on one GPU, twice, makes exactly that GPU suspect, named by node, slot
  and UUID, and not its three siblings — in a lab of this one node;
- the drilled GPU moved to another node carries its status there, and the node it left
  (a new GPU in its slot) is no longer suspect;
- a GPU that computes with one thread instead of the node's two (a real difference of
  this CPU's long sums, found from the run itself, never assumed) is split from its
  siblings by /divergence and watched by the audit, named by slot and UUID.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.agent import fake_gpu, fake_gpu_env, run_agent
from helpers.e2e import upload_with_agent
from helpers.processes import run_cli

A = [fake_gpu(n) for n in range(4)]
DRILLED = A[2]
B = [DRILLED, *(fake_gpu(n) for n in (10, 11, 12))]  # the drilled GPU at gpu-b's cuda:0
A_REPAIRED = [A[0], A[1], fake_gpu(20), A[3]]  # a new GPU in gpu-a's cuda:2
STRICT = ("--variants", "strict", "--repeats", "1")
# gpu-c's cuda:3 computes with one thread, its siblings with the node's two.
C = [fake_gpu(n) for n in (30, 31, 32)] + [fake_gpu(33, threads=1)]


def _run(out: Path, name: str, node: str, gpus: list[dict[str, Any]], *args: str) -> Path:
    path = out / f"{name}.json"
    done = run_agent("run", "--node", node, *STRICT, *args, "--output", str(path),
                     env=fake_gpu_env(gpus), timeout=600)
    assert done.returncode == 0, done.stderr
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """gpu-a drilled on cuda:2 twice; then gpu-b with that GPU (and the collectives);
    then gpu-a with a new GPU at cuda:2. Measured in that order (the nodes' history)."""
    out = tmp_path_factory.mktemp("gpu-fleet")
    drill = ("--workloads", "mlp", "--fault-drill", "--drill-device", "cuda:2")
    return {
        "a1": _run(out, "a1", "gpu-a", A, *drill),
        "a2": _run(out, "a2", "gpu-a", A, *drill),
        "b1": _run(out, "b1", "gpu-b", B, "--workloads", "mlp,collectives"),
        "a3": _run(out, "a3", "gpu-a", A_REPAIRED, "--workloads", "mlp"),
        "c1": _run(out, "c1", "gpu-c", C, "--workloads", "probes"),
    }


def get(server: Any, path: str, **params: Any) -> dict[str, Any]:
    response = httpx.get(f"{server.base_url}/api/v1/{path}", params=params,
                         headers=server.headers("reader"), timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def test_one_run_without_device_measures_every_gpu(runs: dict[str, Path]) -> None:
    document = json.loads(runs["b1"].read_text())
    assert [(d["device"], d["uuid"], d["serial"]) for d in document["devices"]] == [
        (f"cuda:{i}", gpu["uuid"], gpu["serial"]) for i, gpu in enumerate(B)]
    on = {(r["workload"], r["device"]) for r in document["results"] if r["status"] == "ok"}
    assert {("mlp", f"cuda:{i}") for i in range(4)} <= on
    # The collectives span the node: once, on its first GPU, with gloo on this CPU.
    (collectives,) = [r for r in document["results"] if r["workload"] == "collectives"]
    assert collectives["device"] == "cuda:0" and collectives["status"] == "ok"
    assert collectives["collectives"]["backend"] == "gloo"


def test_a_drilled_gpu_is_suspect_its_siblings_are_not_and_it_moves_with_its_uuid(
        runs: dict[str, Path], live_server: Any, tmp_path: Path) -> None:
    upload_with_agent([runs["a1"], runs["a2"]], live_server, tmp_path / "spool-a")
    audit = get(live_server, "audit")
    (entry,) = audit["suspects"]
    assert (entry["node"], entry["device"], entry["device_uuid"], entry["status"]) == \
        ("gpu-a", "cuda:2", DRILLED["uuid"], "suspect")
    assert entry["device_serial"] == DRILLED["serial"]
    assert entry["drill_runs"] == 2 and entry["peers"] == 3
    assert f"UUID {DRILLED['uuid']}" in entry["detail"]
    # The audit's comparison, a sibling GPU of the same run against it, finds the layer
    # the drill corrupted.
    link = entry["compare"]
    compared = get(live_server, "compare", run_a=link["run_a"], run_b=link["run_b"],
                   device_a=link["device_a"], device_b=link["device_b"])
    (pair,) = compared["pairs"]
    drilled = json.loads(runs["a2"].read_text())
    (flipped,) = [r["drill"]["layer"] for r in drilled["results"] if "drill" in r]
    assert pair["first_divergent_layer"]["name"] == flipped

    upload_with_agent([runs["b1"], runs["a3"]], live_server, tmp_path / "spool-b")
    # The GPU belongs to gpu-a, which reported it first: gpu-b's report of it is a claim
    # until an admin confirms the move (issue 29).
    assert get(live_server, "audit")["suspects"] == []
    run_cli("device", "move", DRILLED["uuid"], "--to", "gpu-b",
            database_url=live_server.database_url)
    audit = get(live_server, "audit")
    (entry,) = audit["suspects"]
    assert (entry["node"], entry["device"], entry["device_uuid"]) == \
        ("gpu-b", "cuda:0", DRILLED["uuid"])
    assert entry["status"] == "suspect" and entry["currently_disagrees"] is False
    assert audit["summary"]["suspect"] == 1  # gpu-b; gpu-a is clear
    devices_a = {d["device"]: d["uuid"] for d in get(live_server, "nodes/gpu-a")["devices"]}
    assert devices_a["cuda:2"] == fake_gpu(20)["uuid"]
    assert DRILLED["uuid"] not in devices_a.values()
    (move,) = [row for row in audit["drift"] if row["device"]]
    assert (move["previous_node"], move["node"]) == ("gpu-a", "gpu-b")


def test_a_gpu_computing_with_other_threads_is_split_from_its_siblings(
        runs: dict[str, Path], live_server: Any, tmp_path: Path) -> None:
    document = json.loads(runs["c1"].read_text())
    tensors = {r["device"]: {t["name"]: t["hash"] for t in r["tensors"]}
               for r in document["results"] if r["status"] == "ok"}
    siblings = [tensors[f"cuda:{i}"] for i in range(3)]
    assert siblings[0] == siblings[1] == siblings[2]  # same threads: the same bits
    differing = sorted(name for name, digest in tensors["cuda:3"].items()
                       if siblings[0][name] != digest)
    if not differing:
        pytest.skip("on this CPU no probe depends on the thread count")
    upload_with_agent([runs["c1"]], live_server, tmp_path / "spool")
    report = get(live_server, "divergence", workload="probes", variant="strict",
                 tensor=differing[0])
    assert [(g["size"], g["devices"]) for g in report["groups"]] == [
        (3, [{"node": "gpu-c", "device": f"cuda:{i}"} for i in range(3)]),
        (1, [{"node": "gpu-c", "device": "cuda:3"}])]
    (entry,) = get(live_server, "audit")["suspects"]
    assert (entry["node"], entry["device"], entry["device_uuid"], entry["status"]) == \
        ("gpu-c", "cuda:3", C[3]["uuid"], "watch")
