"""`numparity-agent explain` against a live server, end to end (design §2.11, §3.2).

Two real agents upload `mlp` to a real uvicorn on SQLite and on PostgreSQL, one with
`MKL_CBWR=COMPATIBLE`; then `explain` on each node, through the agent's own CLI and
token, reads the other's run from `GET /api/v1/agent/reference/{run_id}`, finds the
setting that gives that run's bits, and posts it; the server lists the findings and
shows both beside the split. Whether `MKL_CBWR=COMPATIBLE` changes mlp's bits depends on
the CPU: read from the two uploaded runs, and the test skips where it changes none.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.agent import clean_env, run_agent

from numparity_server.kit.db import get_engine, session_factory
from numparity_server.kit.settings import Settings
from numparity_server.reads.explanations import explanations_between

NODES = {"lab-01": {}, "lab-mkl": {"MKL_CBWR": "COMPATIBLE"}}


def server_args(server: Any) -> list[str]:
    return ["--server", server.base_url, "--token", server.agent_token]


def get(server: Any, path: str, role: str = "reader", **params: str) -> Any:
    answer = httpx.get(f"{server.base_url}/api/v1{path}", params=params,
                       headers=server.headers(role), timeout=60)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_explain_finds_mkl_cbwr_in_both_directions(live_server: Any, tmp_path: Path) -> None:
    run_ids = {}
    for node, env in NODES.items():
        done = run_agent("run", "--workloads", "mlp", "--variants", "default", "--repeats",
                         "1", "--node", node, "--spool", str(tmp_path / f"spool-{node}"),
                         *server_args(live_server), env=clean_env(**env), timeout=300)
        assert done.returncode == 0, done.stderr
        (run,) = get(live_server, "/runs", node=node)["items"]
        run_ids[node] = run["run_id"]

    # What explain will read, with the agent's token: the two runs' tensors.
    hashes = {node: [(t["name"], t["hash"]) for r in get(
        live_server, f"/agent/reference/{run_id}", role="agent")["results"]
        for t in r["tensors"]] for node, run_id in run_ids.items()}
    assert hashes["lab-01"] and [n for n, _ in hashes["lab-01"]] == [
        n for n, _ in hashes["lab-mkl"]]
    if hashes["lab-01"] == hashes["lab-mkl"]:
        pytest.skip("MKL_CBWR=COMPATIBLE changes no bit of mlp on this CPU")

    expected = {"lab-01": ("lab-mkl", "MKL_CBWR=COMPATIBLE", {"MKL_CBWR": "COMPATIBLE"}),
                "lab-mkl": ("lab-01", "MKL_CBWR unset", {"MKL_CBWR": None})}
    for node, (against, label, _env) in expected.items():
        done = run_agent("explain", "--against", run_ids[against], "--node", node,
                         *server_args(live_server), env=clean_env(**NODES[node]),
                         timeout=300)
        assert done.returncode == 0, done.stderr
        assert (f"mlp/default: this node gives run {run_ids[against]}'s bits with {label}"
                in done.stdout), done.stdout
        assert "findings uploaded" in done.stderr

    for node, (against, label, env) in expected.items():
        (finding,) = get(live_server, "/explanations", node=node)["items"]
        assert {k: finding[k] for k in ("node", "against_node", "against_run", "suite",
                                        "workload", "variant", "device", "local_device",
                                        "status", "label", "setting", "closest", "stale")} == {
            "node": node, "against_node": against, "against_run": run_ids[against],
            "suite": "standard", "workload": "mlp", "variant": "default", "device": "cpu",
            "local_device": "cpu", "status": "reproduced", "label": label,
            "setting": {"env": env, "knobs": {}}, "closest": None, "stale": False}
        assert finding["tried"] >= 1 and finding["seconds"] > 0

    # Beside the split, both findings, whichever side is which.
    settings = Settings(database_url=live_server.database_url)
    with session_factory(get_engine(settings))() as session:
        beside = explanations_between(session=session, suite="standard", workload="mlp",
                                      variant="default", nodes_a=["lab-mkl"],
                                      nodes_b=["lab-01"])
    assert sorted((f.node, f.label) for f in beside) == [
        ("lab-01", "MKL_CBWR=COMPATIBLE"), ("lab-mkl", "MKL_CBWR unset")]
