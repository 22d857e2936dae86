"""`make gpu-check` on a machine without a GPU: the dry run with a fake GPU at the edge
(NUMPARITY_GPU_CHECK_FAKE=1, tests/helpers/fake_cuda) runs every check end to end -- the
agent from the checkout, the embedded server on SQLite, the uploads, /divergence,
explain, traces, the large suite, the judge -- and prints one table; without a GPU and
without the flag it says so; without the server's packages and without wheels it says
how to get them."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ALONE = ROOT / "tests" / "helpers" / "agent_alone"
ROWS = ["identity", "variants", "variant overhead", "TF32 split", "explain", "SDPA backends",
        "NCCL collectives", "profiler kernel names", "large-suite upload", "CUDA isclose"]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMPARITY_")}
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gpu-check")
    args = (f"--workloads mlp decoder collectives --variants default strict "
            f"--keep {tmp / 'work'} --json {tmp / 'rows.json'}")
    done = subprocess.run(
        ["make", "--no-print-directory", "gpu-check", f"GPU_PYTHON={sys.executable}",
         f"GPU_CHECK_ARGS={args}"],
        cwd=ROOT, env=_env(NUMPARITY_GPU_CHECK_FAKE="1"), capture_output=True, text=True,
        timeout=1200, check=False)
    rows = json.loads((tmp / "rows.json").read_text()) if (tmp / "rows.json").exists() else []
    return done, {row["check"]: row for row in rows}, tmp / "work"


def test_the_dry_run_prints_one_table_with_every_check(dry_run):
    done, rows, _work = dry_run
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert list(rows) == ROWS
    table = done.stdout
    assert "numparity gpu-check on cuda:0 (FAKE CUDA)" in table
    for name in ROWS:
        assert any(line.startswith(name) for line in table.splitlines()), name
    assert not [r for r in rows.values() if r["status"] == "FAIL"]


def test_the_fake_gpu_is_identified_as_nvml_describes_it(dry_run):
    _done, rows, _work = dry_run
    identity = rows["identity"]
    assert identity["status"] == "ok"
    assert identity["data"]["uuid"] == "GPU-00000000-0000-4000-8000-000000000028"
    assert identity["data"]["compute_capability"] == "9.0"
    assert identity["data"]["pci_bus_id"] == "00000000:19:00.0"


def test_every_run_of_the_check_reached_the_embedded_server(dry_run):
    _done, rows, work = dry_run
    assert rows["variants"]["status"] == "ok"
    assert rows["variants"]["detail"].startswith("default 3 ok; strict 3 ok")
    assert rows["large-suite upload"]["status"] == "ok"
    with sqlite3.connect(work / "numparity.db") as db:
        nodes = {name for (name,) in db.execute(
            "SELECT nodes.name FROM runs JOIN nodes ON runs.node_id = nodes.id")}
    assert {"gpu-check-stock", "gpu-check-tf32-off", "gpu-check-large"} <= nodes


def test_on_a_fake_gpu_what_only_a_gpu_answers_is_not_applicable_and_says_why(dry_run):
    _done, rows, _work = dry_run
    for name in ("TF32 split", "NCCL collectives", "profiler kernel names"):
        assert rows[name]["status"] == "n/a" and "fake CUDA" in rows[name]["detail"], name
    # The checks still ran: two nodes compared, gloo ranks, a traced run.
    assert rows["TF32 split"]["data"]["tf32_off_run"]
    assert rows["NCCL collectives"]["data"]["backend"] == "gloo"
    assert rows["SDPA backends"]["status"] == "ok"
    assert "math" in rows["SDPA backends"]["data"]["backends"]


def test_the_judge_agrees_with_isclose_on_the_device_it_ran_on(dry_run):
    """On the fake GPU isclose runs on the CPU: the judge's CPU arithmetic must call
    every boundary pair as torch.isclose does (the oracle)."""
    _done, rows, _work = dry_run
    isclose = rows["CUDA isclose"]
    assert isclose["data"]["differing"] == 0, isclose["detail"]


def test_without_a_gpu_and_without_the_flag_it_says_so() -> None:
    done = subprocess.run([sys.executable, "tools/gpu_check.py"], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 2
    assert "no CUDA device here" in done.stderr and "NUMPARITY_GPU_CHECK_FAKE=1" in done.stderr


def test_without_the_server_packages_or_wheels_it_says_how_to_get_them(tmp_path) -> None:
    env = _env(PYTHONPATH=str(ALONE), NUMPARITY_GPU_CHECK_WHEELS=str(tmp_path / "none"))
    done = subprocess.run([sys.executable, "tools/gpu_check.py"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 2
    assert "numparity_server" in done.stderr and "make wheels" in done.stderr
