"""The op where two environments part, and the setting that makes them agree, end to end
(design §2.10, §2.11, §3.3.14).

Real agents record op traces (`run --trace-ops`) of `mlp`, `train` and `probes` on four
simulated nodes — two stock, one with `MKL_CBWR=COMPATIBLE`, one with a single OpenMP
thread — and upload through `flush` to a real uvicorn on SQLite and on PostgreSQL. Which
workloads each setting splits depends on the CPU: the splits are read from the runs
themselves, and a setting that splits nothing here skips its checks. For every split:

- `/compare` and `/divergence` name the origin op: the first op that both runs ran on the
  same input bits and whose output differs, computed here independently from the two
  uploaded traces (a plain walk over two op lists of the same sequence);
- the op's module is one the workload's model has (or the optimizer's step, or the top
  level for probes), and where its output is a recorded layer the server gives the error;
- `numparity-agent explain`, from each side against the other, finds the setting and
  the server shows the finding beside the split in `/compare` and `/divergence`.
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
from helpers.agent import clean_env, run_agent
from helpers.e2e import upload_with_agent

pytestmark = pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two cores")

WORKLOADS = ("mlp", "train", "probes")
NODES = {"stock-1": {}, "stock-2": {}, "mkl": {"MKL_CBWR": "COMPATIBLE"},
         "one-thread": {"OMP_NUM_THREADS": "1"}}
# The setting explain must find, from the stock side and back from the split's side.
SETTINGS = {"mkl": ("MKL_CBWR=COMPATIBLE", "MKL_CBWR unset"),
            "one-thread": ("OMP_NUM_THREADS=1", "OMP_NUM_THREADS unset")}


@pytest.fixture(scope="module")
def documents(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("origin")
    found = {}
    for node, env in NODES.items():
        path = out / f"{node}.json"
        done = subprocess.run(
            [sys.executable, "-m", "numparity_agent", "run", "--node", node, "--workloads",
             *WORKLOADS, "--variants", "default", "--repeats", "1", "--trace-ops",
             "--output", str(path)],
            env=clean_env(**env), capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
        found[node] = path
    return found


def _load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def _result(document: dict[str, Any], workload: str) -> dict[str, Any]:
    return next(r for r in document["results"] if r["workload"] == workload)


def _trace(document: dict[str, Any], workload: str) -> dict[str, Any]:
    digest = _result(document, workload)["trace"]
    return next(t for t in document["traces"] if t["hash"] == digest)


def splits(documents: dict[str, Path]) -> list[tuple[str, str]]:
    """(node, workload) whose tensors differ from stock-1's on this CPU."""
    stock = _load(documents["stock-1"])
    found = []
    for node in SETTINGS:
        other = _load(documents[node])
        for workload in WORKLOADS:
            hashes = [[t["hash"] for t in _result(d, workload)["tensors"]]
                      for d in (stock, other)]
            if hashes[0] != hashes[1]:
                found.append((node, workload))
    return found


def first_origin(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """The oracle: the first op of two traces of the same op sequence with the same
    inputs and other arguments and another output."""
    assert [(o["op"], o["module"]) for o in a["ops"]] == [(o["op"], o["module"])
                                                          for o in b["ops"]]
    return next(x for x, y in zip(a["ops"], b["ops"], strict=True)
                if x["in"] == y["in"] and x.get("args") == y.get("args")
                and x["out"] != y["out"])


def get(server: Any, path: str, role: str = "reader", **params: str) -> Any:
    answer = httpx.get(f"{server.base_url}/api/v1/{path}", params=params,
                       headers=server.headers(role), timeout=120)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_origin_ops_and_the_settings_that_explain_them(documents, live_server, tmp_path):
    found = splits(documents)
    if not found:
        pytest.skip("neither MKL_CBWR=COMPATIBLE nor one thread changes a bit of "
                    f"{', '.join(WORKLOADS)} on this CPU")
    upload_with_agent(list(documents.values()), live_server, tmp_path / "spool")
    runs = {node: _load(path)["run_id"] for node, path in documents.items()}
    stock = _load(documents["stock-1"])

    for node, workload in found:
        oracle = first_origin(_trace(stock, workload), _trace(_load(documents[node]),
                                                              workload))
        # /compare: the pair names the same first origin op, in a module of the model.
        (pair,) = get(live_server, "compare", run_a=runs["stock-1"], run_b=runs[node],
                      workload=workload, variant="default")["pairs"]
        origin = pair["origin"]
        assert origin is not None, pair.get("origin_note")
        first = origin["ops"][0]
        assert (first["op"], first["module"], first["phase"]) == (
            oracle["op"], oracle["module"], oracle["phase"]), (node, workload)
        assert origin["same_sequence"] and origin["parting"] is None
        if workload != "probes" and first["phase"] != "optimizer":
            # Forward or backward, the op ran for one of the model's layers.
            assert first["module"] in {t["name"] for t in _result(stock, workload)["tensors"]
                                       if t["kind"] == "layer"}
        recorded = {t["hash"][:16]: t["name"] for t in _result(stock, workload)["tensors"]}
        if oracle["out"][0] in recorded:
            assert first["tensor"] == recorded[oracle["out"][0]]
            output = first["output"]
            assert output["verdict"] in ("equivalent", "divergent")
            # Whole values measured (a small tensor), else what the sketch saw.
            assert (output["metrics"]["max_ulp"] or 0) >= 1 or output["evidence"]

        # /divergence (groups by the whole result): the pair of the stock group and the
        # split's names it too.
        report = get(live_server, "divergence", workload=workload, variant="default")
        named = [p["origin"]["ops"][0]["op"] for p in report["pairs"]
                 if p.get("origin") and p["origin"]["ops"]]
        assert oracle["op"] in named, json.dumps(report["pairs"], indent=1)[:3000]

    # explain, from each side against the other, for each setting that splits here.
    for node in sorted({node for node, _ in found}):
        there, back = SETTINGS[node]
        workloads = sorted({w for n, w in found if n == node})
        for explainer, against, env, label in (("stock-2", node, {}, there),
                                                (node, "stock-1", NODES[node], back)):
            done = run_agent("explain", "--against", runs[against], "--node", explainer,
                             "--workloads", *workloads, "--server", live_server.base_url,
                             "--token", live_server.agent_token, env=clean_env(**env),
                             timeout=300)
            assert done.returncode == 0, done.stderr
            for workload in workloads:
                assert (f"{workload}/default: this node gives run {runs[against]}'s bits "
                        f"with {label}") in done.stdout, done.stdout
        # Beside the split: /compare of the stock run and the split's run shows both.
        for workload in workloads:
            (pair,) = get(live_server, "compare", run_a=runs["stock-2"], run_b=runs[node],
                          workload=workload, variant="default")["pairs"]
            assert {(e["node"], e["label"]) for e in pair["explanations"]} == {
                ("stock-2", there)}
            (pair,) = get(live_server, "compare", run_a=runs["stock-1"], run_b=runs[node],
                          workload=workload, variant="default")["pairs"]
            assert {(e["node"], e["label"]) for e in pair["explanations"]} == {(node, back)}
            report = get(live_server, "divergence", workload=workload, variant="default")
            beside = {(e["node"], e["label"]) for p in report["pairs"]
                      for e in p.get("explanations") or []}
            assert {("stock-2", there), (node, back)} <= beside
