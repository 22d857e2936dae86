"""Data pipeline determinism end to end (design §2.2, §3.3.12): real agents run the `data`
workload and two lab DataLoader factories with real DataLoader worker processes, on three
simulated nodes — two stock, one whose numpy draws `default_rng` from another bit
generator (tests/helpers/numpy_pcg64dxsm: another numpy release's generator, its version
saying so) — and upload through `flush` to a real uvicorn, on SQLite and on PostgreSQL.

- `/audit`'s data pipeline rows say, per environment, that the recipe holds and what
  breaks without it, naming the duplicated augmentation and its workers (the `data`
  workload's `jitter`, drawn from a generator its dataset holds; the lab's `offset`,
  which its own worker_init_fn seeds alike in every worker);
- `/divergence` on `data`, and on the lab's reproducible pipeline, splits the numpy node
  from its stock peers, and attribution names numpy's version.
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
from helpers.agent import clean_env
from helpers.e2e import upload_with_agent

pytestmark = pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two cores")

HELPERS = Path(__file__).resolve().parents[1] / "helpers"
NODES = {"stock-1": [], "stock-2": [], "numpy-next": [HELPERS / "numpy_pcg64dxsm"]}
DUPLICATING = "agent_test_data_factories:duplicating"
HELD = "agent_test_data_factories:held"


@pytest.fixture(scope="module")
def documents(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("data")
    found = {}
    for node, paths in NODES.items():
        env = clean_env()
        env["PYTHONPATH"] = os.pathsep.join([*map(str, paths), env["PYTHONPATH"]])
        path = out / f"{node}.json"
        done = subprocess.run(
            [sys.executable, "-m", "numparity_agent", "run", "--node", node, "--workloads",
             "data", DUPLICATING, HELD, "--variants", "default", "--output", str(path)],
            env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
        found[node] = path
    return found


def get(server: Any, path: str, **params: str) -> Any:
    answer = httpx.get(f"{server.base_url}/api/v1/{path}", params=params,
                       headers=server.headers("reader"), timeout=120)
    assert answer.status_code == 200, answer.text
    return answer.json()


def result(document: dict[str, Any], workload: str) -> dict[str, Any]:
    return next(r for r in document["results"] if r["workload"] == workload)


def test_the_recipe_is_audited_and_a_changed_generator_splits_and_is_attributed(
        documents, live_server, tmp_path):
    upload_with_agent(list(documents.values()), live_server, tmp_path / "spool")
    loaded = {node: json.loads(path.read_text()) for node, path in documents.items()}
    env_of = {node: d["environment"]["env_key"] for node, d in loaded.items()}
    assert env_of["stock-1"] == env_of["stock-2"] != env_of["numpy-next"]
    # Two nodes of one environment report the same checks (one outcome), even of the
    # configurations whose bytes change from run to run.
    for workload in ("data", DUPLICATING, HELD):
        assert result(loaded["stock-1"], workload)["checks"] == \
            result(loaded["stock-2"], workload)["checks"], workload
    for document in loaded.values():
        # Real workers ran: two at least, whatever the node's CPUs.
        assert result(document, "data")["data"]["num_workers"][:2] == [0, 2]
        assert result(document, "data")["repeats"] == 1

    audit = get(live_server, "audit")
    rows = {(row["env_key"], row["workload"]): row for row in audit["data_pipeline"]}
    assert set(rows) == {(env, workload) for env in env_of.values()
                         for workload in ("data", DUPLICATING, HELD)}
    stock = rows[(env_of["stock-1"], "data")]
    assert stock["devices"] == 2 and stock["recipe_holds"] is True
    assert stock["without"] == "no_recipe" and stock["needs_recipe"] is True
    assert "jitter repeats in workers 0, 1 (num_workers=2)" in stock["without_broken"]
    assert any(b["check"] == "order_reproducible" and b["configuration"] == "no_recipe"
               for b in stock["breaks"])
    # Every row is what that environment's uploaded checks say, nothing recomputed.
    for node in ("stock-1", "numpy-next"):
        checks = result(loaded[node], "data")["checks"]
        row = rows[(env_of[node], "data")]
        assert row["recipe_holds"] is all(checks[f"recipe_{c}"]["equal"] for c in (
            "order_reproducible", "runs_agree", "streams_distinct"))
        assert row["workers_agree"] is checks["recipe_workers_agree"]["equal"]
    lab = rows[(env_of["stock-1"], DUPLICATING)]
    assert lab["without"] == "own" and lab["without_holds"] is False
    assert "offset, x repeat in workers 0, 1 (num_workers=2)" in lab["without_broken"]
    # The lab's worker_init_fn runs after the recipe's, and undoes it.
    assert lab["recipe_holds"] is False
    assert "offset, x repeat in workers 0, 1 (num_workers=2)" in lab["recipe_broken"]
    assert rows[(env_of["stock-1"], HELD)]["without_holds"] is True

    # Across nodes: the changed generator moves the batches' jitter, and the split is
    # attributed to numpy's version.
    for workload in ("data", HELD):
        report = get(live_server, "divergence", workload=workload, variant="default")
        group = {node: g["id"] for g in report["groups"] for node in g["nodes"]}
        assert group["stock-1"] == group["stock-2"] != group["numpy-next"], workload
        (split,) = [p for p in report["pairs"]
                    if {p["a"], p["b"]} == {group["stock-1"], group["numpy-next"]}]
        attributes = [item["attribute"] for item in split["attribution"]]
        assert attributes[0] == "numpy.version", (workload, attributes)
    # What moved is what numpy draws, not the order (torch's): per tensor.
    stock_hashes = {t["name"]: t["hash"] for t in result(loaded["stock-1"], "data")["tensors"]}
    next_hashes = {t["name"]: t["hash"] for t in result(loaded["numpy-next"], "data")["tensors"]}
    moved = {name.rsplit(".", 1)[-1] for name in stock_hashes
             if stock_hashes[name] != next_hashes[name]}
    assert moved == {"jitter", "image"}
    report = get(live_server, "divergence", workload="data", variant="default",
                 tensor="recipe.order")
    assert len(report["groups"]) == 1
