"""The analysis end to end on a real simulated fleet (design §5): issue "Analysis".

Real agents measure `cnn` on nodes of this machine and upload with `flush` to a real
server. The server must then say what a lab needs to act on:
- the split caused by `MKL_CBWR` is attributed to `MKL_CBWR`;
- a node run twice with `--fault-drill` is `suspect` (marked as a drill) while its three
  identical peers are not, and `/compare` names the layer the drill corrupted as the
  first divergent layer;
- a node whose user workload's output changes from repeat to repeat is nondeterministic;
- the `bf16-autocast` group is accepted or rejected by the fp64 judge, with its numbers,
  and the verdict agrees with a float64 recomputation from the uploaded values.
"""

from __future__ import annotations

import base64
import json
import math
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from helpers.e2e import upload_with_agent

from numparity_server.demo import SimulatedNode, node_environment

pytestmark = pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two cores")

HERE = Path(__file__).resolve().parent
STOCK = ("stock-1", "stock-2", "stock-3")
CNN = ("--workloads", "cnn")


def _measure(out: Path, name: str, args: tuple[str, ...], env: dict[str, str] | None = None,
             tag: str = "") -> Path:
    path = out / f"{name}{tag}.json"
    node = SimulatedNode(name, env or {})
    environment = node_environment(node)
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE),
                                                              environment.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-m", "numparity_agent", "run", "--node", name, *args,
         "--output", str(path)],
        env=environment, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return path


@pytest.fixture(scope="session")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Every run document, measured once by the real agent, two agents at a time.

    The drilled node's two runs are measured one after the other (their order is the
    node's history)."""
    out = tmp_path_factory.mktemp("audit-fleet")
    jobs: list[tuple[Any, ...]] = [
        ("stock-1", (*CNN, "--variants", "default", "strict", "bf16-autocast",
                     "fp64-reference")),
        *((name, (*CNN, "--variants", "default", "strict")) for name in STOCK[1:]),
        ("mkl", (*CNN, "--variants", "default", "strict"), {"MKL_CBWR": "COMPATIBLE"}),
        ("flaky", ("--workloads", "nondeterministic_workload:unordered_sum",
                   "--variants", "default", "--repeats", "3")),
    ]
    with ThreadPoolExecutor(max_workers=2) as pool:
        drilled = pool.submit(lambda: [
            _measure(out, "drilled", (*CNN, "--variants", "default", "strict",
                                      "--fault-drill"), tag=f"-{i}")
            for i in (1, 2)])
        others = [pool.submit(_measure, out, *job) for job in jobs]
        return [*(f.result() for f in others), *drilled.result()]


@pytest.fixture
def server(fleet: list[Path], live_server: Any, tmp_path: Path) -> Any:
    """The live server with the fleet uploaded through the agent's own `flush`."""
    upload_with_agent(fleet, live_server, tmp_path / "spool")
    return live_server


def get(server: Any, path: str, **params: Any) -> dict[str, Any]:
    response = httpx.get(f"{server.base_url}/api/v1/{path}", params=params,
                         headers=server.headers("reader"), timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def document(fleet: list[Path], name: str) -> dict[str, Any]:
    return json.loads(next(p for p in fleet if p.name.startswith(name)).read_text())


def output_values(doc: dict[str, Any], variant: str) -> np.ndarray:
    (result,) = [r for r in doc["results"] if r["variant"] == variant and r["status"] == "ok"]
    (tensor,) = [t for t in result["tensors"] if t["kind"] == "output"]
    raw = base64.b64decode(tensor["values"]["data"])
    dtype = tensor["values"]["dtype"]
    if dtype == "bfloat16":
        bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << np.uint32(16)
        return bits.view(np.float32).astype(np.float64)
    return np.frombuffer(raw, dtype={"float32": "<f4", "float64": "<f8"}[dtype]) \
        .astype(np.float64)


def test_the_mkl_split_is_attributed_to_mkl_cbwr(server: Any) -> None:
    for variant in ("default", "strict"):
        report = get(server, "divergence", workload="cnn", variant=variant)
        (mkl,) = [g["id"] for g in report["groups"] if "mkl" in g["nodes"]]
        (stock,) = [g["id"] for g in report["groups"] if "stock-1" in g["nodes"]]
        assert mkl != stock
        (pair,) = [p for p in report["pairs"] if {p["a"], p["b"]} == {mkl, stock}]
        assert pair["attribution"][0]["attribute"] == "env_vars.MKL_CBWR"
        assert sorted([pair["attribution"][0]["a"], pair["attribution"][0]["b"]]) == \
            [["COMPATIBLE"], ["unset"]]


def test_the_drilled_node_is_a_suspect_and_its_peers_are_not(server: Any,
                                                             fleet: list[Path]) -> None:
    audit = get(server, "audit")
    (entry,) = audit["suspects"]
    assert entry["node"] == "drilled" and entry["status"] == "suspect"
    assert entry["drill"] is True and entry["disagreeing_runs"] == 2
    assert entry["peers"] == 3 and entry["majority_nodes"] == 3
    assert {key["workload"] for key in entry["keys"]} == {"cnn"}
    assert audit["summary"]["suspect"] == 1 and audit["summary"]["watch"] == 0

    # The comparison the audit links to finds the layer the drill corrupted.
    link = entry["compare"]
    comparison = get(server, "compare", run_a=link["run_a"], run_b=link["run_b"],
                     workload="cnn", variant="strict")
    (pair,) = comparison["pairs"]
    drilled = [r for r in document(fleet, "drilled")["results"] if r["variant"] == "strict"]
    corrupted = drilled[0]["drill"]["layer"]
    assert pair["first_divergent_layer"]["name"] == corrupted
    # The default variant is untouched by the drill: the drilled node is one of the stock.
    report = get(server, "divergence", workload="cnn", variant="default")
    (stock,) = [g for g in report["groups"] if "stock-1" in g["nodes"]]
    assert {"stock-2", "stock-3", "drilled"} <= set(stock["nodes"])


def test_a_workload_that_changes_between_repeats_is_nondeterministic(server: Any) -> None:
    audit = get(server, "audit")
    entries = [e for e in audit["nondeterministic"] if e["node"] == "flaky"]
    assert [(e["reason"], e["workload"]) for e in entries] == \
        [("repeats_disagree", "nondeterministic_workload:unordered_sum")]
    assert not [e for e in audit["nondeterministic"] if e["node"] != "flaky"]
    assert audit["summary"]["nondeterministic"] == 1


def test_the_fp64_judge_on_bf16_autocast(server: Any, fleet: list[Path]) -> None:
    report = get(server, "divergence", workload="cnn", variant="bf16-autocast", tensor="output")
    (group,) = report["groups"]
    judgement = group["fp64"]
    assert judgement["multiplier"] == 3.0
    assert isinstance(judgement["acceptable"], bool)

    # The same numbers from the uploaded values, recomputed here in float64.
    doc = document(fleet, "stock-1")
    reference = output_values(doc, "fp64-reference")
    bf16, strict = output_values(doc, "bf16-autocast"), output_values(doc, "strict")

    def rmse(x: np.ndarray) -> float:
        return math.sqrt(float(np.mean((x - reference) ** 2)))

    assert judgement["rmse"] == pytest.approx(rmse(bf16), rel=1e-9)
    assert judgement["baseline_rmse"] == pytest.approx(rmse(strict), rel=1e-9)
    assert judgement["acceptable"] == (judgement["rmse"] <= judgement["limit"])
    assert judgement["limit"] >= 3.0 * judgement["baseline_rmse"]
