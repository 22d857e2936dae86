"""Preflight end to end (issue "Preflight"): pinned answers, drift against them when the
whole fleet moves, and `numparity-agent check` as a scheduler runs it.

Real agents measure a stock fleet of this machine; a setting that changes this CPU's
numbers is found from the runs themselves (never assumed: which one does depends on the
CPU) and the whole fleet is measured again under it. Through a live server (SQLite and
PostgreSQL):
- an admin pins the stock majority (the CLI on one database, the API on the other);
- `check` on a stock node is a go; with `--fault-drill` the same node is a no-go naming
  its device and the first tensor that differs, within the budget (and with an op drill,
  a conv output corrupted as it is computed);
- once every node runs under the setting, the fleet agrees with itself (one group) and
  the audit and /divergence report its drift from the pin; `check` under the setting is
  a no-go against the pin;
- on a node of fake GPUs, one drilled GPU fails the check and its sibling passes.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.agent import clean_env, fake_gpu, fake_gpu_env, run_agent
from helpers.e2e import upload_with_agent
from helpers.processes import run_cli

pytestmark = pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two cores")

STOCK = ("stock-1", "stock-2", "stock-3")
# strict alone: where peers must agree bit for bit, the variant `check` runs first and the
# one the drill corrupts (one child a run keeps the module's time down).
WORKLOADS = ("--workloads", "cnn", "probes", "--variants", "strict", "--repeats", "1")
# Settings a lab rolls out to every node that change numbers on some CPUs (design §5).
CANDIDATES = ({"MKL_CBWR": "COMPATIBLE"}, {"OMP_NUM_THREADS": "1"},
              {"ATEN_CPU_CAPABILITY": "default"})
# A scheduler's budget for the check; the one the manual's Slurm prolog uses.
BUDGET_S = 60


def _measure(out: Path, name: str, setting: dict[str, str], tag: str) -> Path:
    path = out / f"{name}{tag}.json"
    done = run_agent("run", "--node", name, *WORKLOADS, "--output", str(path),
                     env=clean_env(**setting), timeout=600)
    assert done.returncode == 0, done.stderr
    return path


def _answers(path: Path) -> dict[tuple[str, str], list[tuple[str, str]]]:
    document = json.loads(path.read_text())
    return {(r["workload"], r["variant"]): [(t["name"], t["hash"]) for t in r["tensors"]]
            for r in document["results"] if r["status"] == "ok"}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The stock fleet, the setting that changes this CPU's answers, and the fleet under it."""
    out = tmp_path_factory.mktemp("preflight")
    with ThreadPoolExecutor(max_workers=2) as pool:
        stock = list(pool.map(lambda name: _measure(out, name, {}, "-stock"), STOCK))
    moved_first = setting = None
    for candidate in CANDIDATES:
        probe = _measure(out, STOCK[0], candidate, "-probe")
        if _answers(probe) != _answers(stock[0]):
            setting, moved_first = candidate, probe
            break
    if setting is None:
        pytest.skip("no candidate setting changes this CPU's cnn or probes answers")
    with ThreadPoolExecutor(max_workers=2) as pool:
        moved = [moved_first, *pool.map(lambda name: _measure(out, name, setting, "-moved"),
                                        STOCK[1:])]
    return {"stock": stock, "moved": moved, "setting": setting}


def get(server: Any, path: str, **params: Any) -> dict[str, Any]:
    response = httpx.get(f"{server.base_url}/api/v1/{path}", params=params,
                         headers=server.headers("reader"), timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def check(server: Any, *args: str, env: dict[str, str] | None = None,
          token: str | None = None) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    done = run_agent("check", "--server", server.base_url, "--max-seconds", str(BUDGET_S),
                     *args, env={**(env or clean_env()),
                                 "NUMPARITY_TOKEN": token or server.agent_token},
                     timeout=BUDGET_S + 30)
    return done, time.monotonic() - started


def pin_stock(server: Any) -> dict[str, Any]:
    """Pin the stock majority: the CLI on SQLite, the API (admin token) on PostgreSQL."""
    if server.database_url.startswith("sqlite"):
        done = run_cli("golden", "pin", "--from-majority", "--node", "stock-1", "--reason",
                       "validated before the rollout", "--json", "--by", "lab-admin",
                       database_url=server.database_url)
        found: dict[str, Any] = json.loads(done.stdout)
        assert found["pinned_by"] == "lab-admin"
        return found
    response = httpx.post(f"{server.base_url}/api/v1/goldens", headers=server.headers("admin"),
                          json={"source": "majority", "node": "stock-1",
                                "reason": "validated before the rollout"}, timeout=60)
    assert response.status_code == 201, response.text
    return response.json()


def test_pin_check_and_drift_after_a_fleet_wide_change(
        fleet: dict[str, Any], live_server: Any, tmp_path: Path) -> None:
    upload_with_agent(fleet["stock"], live_server, tmp_path / "spool-stock")
    pinned = pin_stock(live_server)
    assert pinned["version"] == 1 and pinned["in_force"] and pinned["model"] == "cpu"
    assert {(a["workload"], a["variant"]) for a in pinned["answers"]} == {
        ("cnn", "strict"), ("probes", "strict")}
    listed = get(live_server, "goldens")
    assert [item["reason"] for item in listed["items"]] == ["validated before the rollout"]

    # A stock node: go, against the pin, within the budget; one verdict line per device.
    done, seconds = check(live_server)
    assert done.returncode == 0, done.stdout + done.stderr
    (line,) = done.stdout.splitlines()
    assert line.startswith("cpu ") and ": go — " in line and f"pin {pinned['id']}" in line
    assert seconds < BUDGET_S

    # The same node with a flipped bit in strict: no-go, naming the device and the tensor.
    done, seconds = check(live_server, "--fault-drill", "--json")
    assert done.returncode == 10, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert (report["verdict"], report["exit_code"], report["cause"]) == ("no-go", 10, "differs")
    (device,) = report["devices"]
    assert device["device"] == "cpu" and device["verdict"] == "no-go"
    differing = [a for a in device["answers"] if a["status"] == "differs"]
    assert differing and {a["variant"] for a in differing} == {"strict"}
    assert all(a["first_differing"] for a in differing)
    assert seconds < BUDGET_S
    # The measured coverage of the plan it ran and the false-alarm bound (issue 44).
    proof = report["proof"]
    assert set(proof["workloads_measured"]) == {"cnn", "probes"}
    assert 0 < proof["single_bit_seen"] <= 1
    assert "honest evaluations" in proof["statement"]

    # A fault inside the computation (issue 44): a conv output's sign flipped as computed.
    done, seconds = check(live_server, "--fault-drill", "op:conv,call=0,bit=sign", "--json")
    assert done.returncode == 10, done.stdout + done.stderr
    (device,) = json.loads(done.stdout)["devices"]
    assert {a["variant"] for a in device["answers"] if a["status"] == "differs"} == {"strict"}
    assert seconds < BUDGET_S

    # Every node rolls out the setting: the fleet agrees with itself, not with the pin.
    upload_with_agent(fleet["moved"], live_server, tmp_path / "spool-moved")
    moved_keys = {key for key, tensors in _answers(fleet["moved"][0]).items()
                  if tensors != _answers(fleet["stock"][0])[key]}
    workload, variant = sorted(moved_keys)[0]
    report = get(live_server, "divergence", workload=workload, variant=variant)
    assert len(report["groups"]) == 1 and report["groups"][0]["size"] == 3
    (entry,) = report["pins"]
    assert entry["drift"] is True and entry["pinned_group"] is None
    assert (entry["devices_in_scope"], entry["devices_on_pin"]) == (3, 0)
    assert entry["against_pin"]["verdict"] in ("equivalent", "divergent", "nonfinite")

    audit = get(live_server, "audit")
    rows = [r for r in audit["pinned"] if (r["workload"], r["variant"]) == (workload, variant)]
    (row,) = rows
    assert row["peers_agree"] is True and row["devices"] == row["environment_devices"] == 3
    assert row["pin_id"] == pinned["id"] and row["verdict"] is not None
    assert {(r["workload"], r["variant"]) for r in audit["pinned"]} == moved_keys
    assert audit["suspects"] == []  # peers agree: no device is suspect, the fleet moved

    # check under the setting: no-go against the pin (the fleet's answer is another).
    done, _seconds = check(live_server, "--workloads", workload, "--variants", variant,
                           env=clean_env(**fleet["setting"]))
    assert done.returncode == 10, done.stdout + done.stderr
    assert "NO-GO" in done.stdout and f"pin {pinned['id']}" in done.stdout


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_drilled_gpu_fails_the_check_and_its_sibling_passes(
        live_server: Any, tmp_path: Path) -> None:
    gpus = [fake_gpu(40), fake_gpu(41)]
    path = tmp_path / "gpu.json"
    done = run_agent("run", "--node", "gpu-1", "--workloads", "mlp", "--variants", "strict",
                     "--repeats", "1", "--output", str(path), env=fake_gpu_env(gpus),
                     timeout=600)
    assert done.returncode == 0, done.stderr
    # A fleet answer needs two nodes: a second node's run of the same answers (its GPUs
    # reported as another node's are its claims, which count for it).
    second = json.loads(path.read_text())
    second["node"]["name"], second["run_id"] = "gpu-2", f"{second['run_id']}-2"
    (tmp_path / "gpu-2.json").write_text(json.dumps(second))
    upload_with_agent([path, tmp_path / "gpu-2.json"], live_server, tmp_path / "spool")
    done, seconds = check(live_server, "--fault-drill", "--drill-device", "cuda:1",
                          env=fake_gpu_env(gpus))
    assert done.returncode == 10, done.stdout + done.stderr
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert set(lines) == {"cuda:0", "cuda:1"}
    assert ": go — " in lines["cuda:0"] and "fleet's majority" in lines["cuda:0"]
    assert ": NO-GO — mlp/strict" in lines["cuda:1"] and gpus[1]["uuid"] in lines["cuda:1"]
    assert seconds < BUDGET_S
