"""A simulated fleet of real CPU environment differences, end to end.

Real agents (child processes running real torch) measure `cnn` and `probes` on nodes
that differ only in what design §5 says changes numerics on any x86-64 machine with two
cores — `MKL_CBWR=COMPATIBLE` and a single thread — and upload to a real uvicorn on a
loopback port, on SQLite and on PostgreSQL. The server must find the split and name the
attribute that causes it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.e2e import upload_with_agent

from numparity_server.demo import SimulatedNode, node_environment

pytestmark = pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two cores")

FLEET = (
    SimulatedNode("stock-1"),
    SimulatedNode("stock-2"),
    SimulatedNode("mkl-compatible", {"MKL_CBWR": "COMPATIBLE"}),
    SimulatedNode("one-thread", {"OMP_NUM_THREADS": "1"}),
)


@pytest.fixture(scope="session")
def fleet_documents(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each node's run document, measured once by the real agent (`--output`)."""
    out = tmp_path_factory.mktemp("fleet")
    documents = {}
    for node in FLEET:
        path = out / f"{node.name}.json"
        done = subprocess.run(
            [sys.executable, "-m", "numparity_agent", "run", "--node", node.name,
             "--workloads", "cnn", "probes", "--variants", "default", "strict",
             "--output", str(path)],
            env=node_environment(node), capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        documents[node.name] = path
    return documents


def divergence(server: Any, variant: str, workload: str = "cnn",
               tensor: str = "output") -> dict[str, Any]:
    response = httpx.get(
        f"{server.base_url}/api/v1/divergence",
        params={"workload": workload, "variant": variant, "tensor": tensor},
        headers={"Authorization": f"Bearer {server.reader_token}"},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    return response.json()


def group_of(report: dict[str, Any], node: str) -> int:
    (group,) = [g["id"] for g in report["groups"] if node in g["nodes"]]
    return group


def pair(report: dict[str, Any], a: int, b: int) -> dict[str, Any]:
    (found,) = [p for p in report["pairs"] if {p["a"], p["b"]} == {a, b}]
    return found


def attributes(pair_report: dict[str, Any]) -> dict[str, tuple[list[str], list[str]]]:
    return {item["attribute"]: (item["a"], item["b"]) for item in pair_report["attribution"]}


@pytest.mark.parametrize("variant", ["default", "strict"])
def test_fleet_splits_are_found_and_attributed(
    fleet_documents: dict[str, Path], live_server: Any, tmp_path: Path, variant: str
) -> None:
    upload_with_agent(list(fleet_documents.values()), live_server, tmp_path / "spool")
    report = divergence(live_server, variant)

    stock = group_of(report, "stock-1")
    assert group_of(report, "stock-2") == stock, "identical nodes must agree bit for bit"
    mkl = group_of(report, "mkl-compatible")
    assert mkl != stock, report["groups"]

    mkl_split = pair(report, stock, mkl)
    assert mkl_split["verdict"] in {"equivalent", "divergent"}
    assert mkl_split["metrics"]["max_abs"] > 0
    assert mkl_split["first_divergent_layer"]["name"] == "fc1"
    mkl_attrs = attributes(mkl_split)
    assert list(mkl_attrs) == ["env_vars.MKL_CBWR"], mkl_attrs
    stock_side, mkl_side = mkl_attrs["env_vars.MKL_CBWR"]
    if mkl_split["a"] == mkl:
        stock_side, mkl_side = mkl_side, stock_side
    assert (stock_side, mkl_side) == (["unset"], ["COMPATIBLE"])

    # One thread changes how ATen splits a long sum (on any CPU; whether MKL's matmuls
    # depend on the thread count depends on the CPU).
    summed = divergence(live_server, variant, workload="probes", tensor="sum_long")
    stock, one_thread = group_of(summed, "stock-1"), group_of(summed, "one-thread")
    assert group_of(summed, "stock-2") == stock and one_thread != stock, summed["groups"]
    thread_split = pair(summed, stock, one_thread)
    thread_attrs = attributes(thread_split)
    assert "threads.num_threads" in thread_attrs
    assert "env_vars.OMP_NUM_THREADS" in thread_attrs
    assert thread_split["indistinguishable"] is True
    assert "env_vars.MKL_CBWR" not in thread_attrs

    # Over the whole key, the causes are among the predictors of the group.
    assert "env_vars.MKL_CBWR" in [item["attribute"] for item in report["attribution"]]
    ranked = [item["attribute"] for item in summed["attribution"]]
    assert "threads.num_threads" in ranked


def test_upload_without_token_is_401(fleet_documents: dict[str, Path], live_server: Any) -> None:
    body = fleet_documents["stock-1"].read_bytes()
    response = httpx.post(
        f"{live_server.base_url}/api/v1/runs",
        content=body,
        headers={"Content-Type": "application/json"},
    )
    assert response.status_code == 401
    assert "Authorization" in response.text


def test_malformed_document_is_422_naming_the_field(
    fleet_documents: dict[str, Path], live_server: Any
) -> None:
    document = json.loads(fleet_documents["stock-1"].read_bytes())
    document["results"][0]["status"] = {"not": "a status"}
    response = httpx.post(
        f"{live_server.base_url}/api/v1/runs",
        json=document,
        headers={"Authorization": f"Bearer {live_server.agent_token}"},
    )
    assert response.status_code == 422
    body = response.json()
    assert body["error"] == "validation_error"
    located = [".".join(str(part) for part in item["loc"]) for item in body["detail"]]
    assert any("results.0.status" in loc for loc in located), located
