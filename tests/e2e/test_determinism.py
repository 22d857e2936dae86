"""Selective determinism end to end on the CPU (design §2.13, §3.3.16): issue 31.

Real agents run a user workload with one deliberately nondeterministic op (a custom op,
`numparity_lab::unordered_index_add`, that adds rows in a new order on every call unless
torch's deterministic algorithms are on, as CUDA's `index_add_` does) and upload through
`flush` to a live server. The server must then say:
- through /audit and the dashboard, that op's name, module and phase, and the measured
  cost of making only it deterministic next to strict's, both repeatable;
- the CPU's own ops (the deterministic twin, `mlp`) deterministic: no aten op named;
- a node that did not trace says so, and how to name the op;
- a workload whose nondeterminism enters from host data (issue 43: a permutation from
  `os.urandom`) is named where it enters, with the recipe that seeds it;
- the cost's figures are the same in the audit, the CSV, the dashboard and `doctor
  --recipe` (one study: its own interval; issue 43);
- the split between two nondeterministic nodes is not attributed to the environment
  variable that happens to separate them (`NVIDIA_TF32_OVERRIDE`, no effect on a CPU).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.e2e import upload_with_agent

from numparity_server.demo import SimulatedNode, node_environment

pytestmark = pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two cores")

HERE = Path(__file__).resolve().parent
ND = "nondeterministic_op_workload:one_nondeterministic_op"
TWIN = "nondeterministic_op_workload:deterministic_twin"
OP = "numparity_lab.unordered_index_add.default"
HOST = "host_data_workload:urandom_permutation"


def _measure(out: Path, name: str, args: tuple[str, ...], env: dict[str, str],
             tag: str = "") -> Path:
    path = out / f"{name}{tag}.json"
    environment = node_environment(SimulatedNode(name, env))
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE),
                                                              environment.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-m", "numparity_agent", "run", "--node", name, "--variants",
         "default", *args, "--output", str(path)],
        env=environment, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return path


@pytest.fixture(scope="session")
def documents(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    out = tmp_path_factory.mktemp("determinism")
    jobs = [
        ("lab-traced", ("--workloads", ND, TWIN, "mlp", HOST, "--repeats", "3",
                        "--trace-ops", "--study-budget", "2"), {}),
        # The finding: a variable with no effect on a CPU separates two
        # nondeterministic nodes.
        ("lab-untraced", ("--workloads", ND, "--repeats", "2"),
         {"NVIDIA_TF32_OVERRIDE": "0"}),
        ("lab-steady", ("--workloads", TWIN, "mlp", "--repeats", "2", "--trace-ops"),
         {"OMP_NUM_THREADS": "1"}),
    ]
    with ThreadPoolExecutor(max_workers=2) as pool:
        found = list(pool.map(lambda job: _measure(out, *job), jobs))
    # A second run of the traced node: two repeats to compare.
    return [*found, _measure(out, "lab-traced", ("--workloads", ND, "--repeats", "2",
                                                 "--trace-ops", "--study-budget", "2"), {},
                             tag="-2")]


@pytest.fixture
def server(documents: list[Path], live_server: Any, tmp_path: Path) -> Any:
    upload_with_agent(documents, live_server, tmp_path / "spool")
    return live_server


def get(server: Any, path: str, **params: Any) -> dict[str, Any]:
    response = httpx.get(f"{server.base_url}/api/v1/{path}", params=params,
                         headers=server.headers("reader"), timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def _row(audit: dict[str, Any], *, deterministic: bool) -> list[dict[str, Any]]:
    return [row for row in audit["nondeterministic_ops"]
            if row["deterministic"] is deterministic]


def test_the_audit_names_the_op_and_the_cost_of_making_only_it_deterministic(
        server: Any, documents: list[Path]) -> None:
    audit = get(server, "audit")
    traced, untraced_row = sorted(_row(audit, deterministic=False),
                                  key=lambda row: not row["ops"])
    row = traced
    assert row["device_model"] == "cpu" and row["untraced"] == []
    # Only the custom op: the CPU's own ops (linear, exp, the twin's index_add_, mlp)
    # gave the same bits on the same inputs.
    (op,) = row["ops"]
    assert (op["op"], op["module"], op["phase"]) == (OP, "pool", "forward")
    assert op["first"] is True and op["results"] == 1
    assert op["shapes"] == [[64, 48], [64]] and op["dtypes"] == ["float32", "int64"]
    assert op["recipe"] == "deterministic_algorithms"
    # Both ways are measured and repeatable; the words say which costs what, with the
    # figures `doctor --recipe` prints from the node's own document.
    assert op["selective"]["repeatable"] is True and op["strict"]["repeatable"] is True
    assert op["selective"]["ratio"] > 0 and op["strict"]["ratio"] > 0
    for mode in ("selective", "strict"):
        cost = op[mode]
        assert cost["studies"] == 1 and cost["verdict"] in ("measured", "negligible", "noisy")
        if cost["verdict"] == "noisy":
            assert cost["words"].startswith("not measurable on this node now (load ")
        else:
            assert cost["low"] <= cost["ratio"] <= cost["high"]
    assert op["cost"] == (f"selective: {op['selective']['words']}; "
                          f"strict: {op['strict']['words']}")
    latest = documents[-1]  # lab-traced's second run: the audit's latest for the node
    doctor = subprocess.run([sys.executable, "-m", "numparity_agent", "doctor", "--recipe",
                             str(latest)], capture_output=True, text=True, timeout=120)
    assert doctor.returncode == 0, doctor.stderr
    assert (f"# cost against default: selective: {op['selective']['words']}; "
            f"strict: {op['strict']['words']}") in doctor.stdout
    # The host-data workload: no op, but where its difference enters and how to seed it.
    (source,) = row["sources"]
    assert (source["op"], source["module"], source["source"], source["recipe"]) == (
        "aten.sort.default", "scatter", "host_data", "seed_generator")
    assert source["at"].startswith("e2e/host_data_workload.py:")
    assert source["workloads"] == [HOST]
    assert OP in row["summary"] and "pool" in row["summary"]
    # The node that did not trace (its own environment): said, with the run that names
    # the op.
    assert untraced_row["ops"] == [] and untraced_row["disagreeing"] == 1
    (untraced,) = untraced_row["untraced"]
    assert untraced.startswith(f"{ND}/default on lab-untraced:")
    assert "--trace-ops" in untraced


def test_a_node_without_nondeterministic_ops_is_reported_deterministic(server: Any) -> None:
    audit = get(server, "audit")
    (row,) = _row(audit, deterministic=True)
    assert row["ops"] == [] and row["untraced"] == [] and row["disagreeing"] == 0
    assert row["repeated"] == 2  # the twin and mlp of lab-steady
    assert row["summary"].startswith("deterministic")


def test_the_dashboard_shows_the_op_and_both_costs(server: Any) -> None:
    response = httpx.get(f"{server.base_url}/audit", headers=server.headers("reader"),
                         timeout=60)
    assert response.status_code == 200
    html = response.text
    assert "Nondeterministic ops" in html
    assert f'data-op="{OP}"' in html and "<code>pool</code>" in html
    assert 'data-deterministic="yes"' in html
    (op,) = next(row for row in get(server, "audit")["nondeterministic_ops"] if row["ops"]
                 )["ops"]
    # The same words as the audit's, in the op's row.
    assert html.count(op["selective"]["words"]) >= 1 and op["strict"]["words"] in html
    csv = httpx.get(f"{server.base_url}/api/v1/audit", params={
        "format": "csv", "table": "nondeterministic_ops"},
        headers=server.headers("reader"), timeout=60).text
    assert OP in csv and "deterministic_algorithms" in csv
    assert op["selective"]["words"] in csv and "aten.sort.default" in csv


def test_nondeterministic_groups_are_not_attributed_to_the_environment(server: Any) -> None:
    report = get(server, "divergence", workload=ND, variant="default")
    # Every upload of the op is its own draw: each node's answer is another group.
    assert len(report["groups"]) == 2
    assert all(group["nondeterministic"] for group in report["groups"])
    assert report["nondeterministic_groups"] == [1, 2]
    (pair,) = report["pairs"]
    assert pair["nondeterministic"] is True and pair["attribution"] == []
    assert "env_vars.NVIDIA_TF32_OVERRIDE" in [a["attribute"]
                                               for a in pair["attribution_withheld"]]
    assert "nondeterministic" in pair["attribution_note"]
    # The workload page says it instead of naming the variable.
    page = httpx.get(f"{server.base_url}/workloads/{ND}",
                     headers=server.headers("reader"), timeout=60)
    assert page.status_code == 200, page.text
    assert '<b class="nondeterministic">nondeterministic</b>' in page.text
    assert "separated, not named as the cause: <code>env_vars.NVIDIA_TF32_OVERRIDE" in page.text
    # The twin is deterministic on both environments: nothing withheld there.
    twin = get(server, "divergence", workload=TWIN, variant="default")
    assert twin["nondeterministic_groups"] == []


def test_compare_of_two_repeats_names_the_op(server: Any, documents: list[Path]) -> None:
    first, second = (json.loads(path.read_text())["run_id"] for path in documents
                     if path.name.startswith("lab-traced"))
    comparison = get(server, "compare", run_a=first, run_b=second, workload=ND)
    (pair,) = comparison["pairs"]
    assert pair["nondeterministic"] is True
    assert [(op["op"], op["module"]) for op in pair["nondeterministic_ops"]] == [(OP, "pool")]
    assert pair["nondeterminism_note"].startswith(
        "run a and run b's repeats disagree: nondeterministic, first at " + OP)
    assert comparison["environment"] == []  # one environment: nothing to blame
