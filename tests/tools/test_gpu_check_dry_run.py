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

# The dry run is one `make gpu-check` (minutes on a shared CPU): its own deadlines bound it.
pytestmark = pytest.mark.timeout(2400)

ROOT = Path(__file__).resolve().parents[2]
ALONE = ROOT / "tests" / "helpers" / "agent_alone"
FAKE_CUDA = ROOT / "tests" / "helpers" / "fake_cuda"
ROWS = ["identity", "variants", "variant overhead", "fork server", "MIG instances",
        "TF32 split", "explain", "SDPA backends", "NCCL collectives", "profiler kernel names",
        "large-suite upload", "CUDA isclose", "compiled"]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMPARITY_")}
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    """`make gpu-check` as a user runs it, its output read line by line: each line with
    whether the check was still running when it came."""
    tmp = tmp_path_factory.mktemp("gpu-check")
    args = (f"--workloads mlp decoder collectives --variants default strict "
            f"--keep {tmp / 'work'} --json {tmp / 'rows.json'}")
    lines: list[tuple[str, bool]] = []
    with (tmp / "stderr").open("w+") as err, subprocess.Popen(
            ["make", "--no-print-directory", "gpu-check", f"GPU_PYTHON={sys.executable}",
             f"GPU_CHECK_ARGS={args}"],
            cwd=ROOT, env=_env(NUMPARITY_GPU_CHECK_FAKE="1"), stdout=subprocess.PIPE,
            stderr=err, text=True) as process:
        assert process.stdout is not None
        for line in process.stdout:  # bounded: the check's own deadlines end it
            lines.append((line.rstrip("\n"), process.poll() is None))
        process.wait(timeout=1200)
        err.seek(0)
        stderr = err.read()
    done = subprocess.CompletedProcess(process.args, process.returncode,
                                       "\n".join(line for line, _ in lines), stderr)
    done.lines = lines  # type: ignore[attr-defined]
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
    for name in ("TF32 split", "NCCL collectives", "profiler kernel names", "SDPA backends",
                 "compiled"):
        assert rows[name]["status"] == "n/a" and "fake CUDA" in rows[name]["detail"], name
    # The checks still ran: two nodes compared, gloo ranks, a traced run.
    assert rows["TF32 split"]["data"]["tf32_off_run"]
    assert rows["NCCL collectives"]["data"]["backend"] == "gloo"


def test_the_sdpa_row_probes_the_fused_backends_in_half_precision(dry_run):
    """Flash and cuDNN attention take float16/bfloat16 only: the row runs each backend
    under both (on the fake GPU, the CPU's: math runs, within the bound of float64), and
    reports the decoder's float32 attention apart, expecting no flash there."""
    _done, rows, _work = dry_run
    data = rows["SDPA backends"]["data"]
    assert {"math/float16", "math/bfloat16", "flash/float16", "efficient/bfloat16"} \
        <= set(data["probes"])
    for dtype in ("float16", "bfloat16"):
        math = data["probes"][f"math/{dtype}"]
        assert math["ran"] and math["eps"] <= 8.0, math
    assert "math" in data["decoder_backends"]


def test_the_kernel_name_row_traces_deterministic_workloads_under_strict(dry_run):
    _done, rows, _work = dry_run
    data = rows["profiler kernel names"]["data"]
    assert data["variant"] == "strict" and data["workloads"] == ["mlp"]
    assert data["trace_errors"] == 0


def test_each_row_is_printed_as_it_finishes(dry_run):
    done, _rows, _work = dry_run
    running = {line.split("  ")[0].strip(): alive for line, alive in done.lines}
    assert running["identity"] and running["variants"], done.lines
    assert done.lines[-1][0].startswith(f"{len(ROWS)} rows, 0 FAIL, in ")


def test_the_fork_servers_children_measure_what_fresh_interpreters_do(dry_run):
    """The stock run's children were forked (issue 42, 7): its mlp results equal a
    fresh-interpreter run's bit for bit, and a forked probe child saw the fake GPU alone
    and the strict variant's CUBLAS_WORKSPACE_CONFIG before CUDA started."""
    _done, rows, _work = dry_run
    row = rows["fork server"]
    assert row["status"] == "ok", row["detail"]
    assert row["data"]["differ"] == [] and row["data"]["refused"] == []
    probe = row["data"]["probe"]
    assert probe["torch_imported_before"] and not probe["cuda_initialised"]
    assert probe["devices"] == ["00000000-0000-4000-8000-000000000028"]
    mig = rows["MIG instances"]
    assert mig["status"] == "n/a", mig["detail"]
    assert mig["detail"].endswith("node_gpus: 1, NVML's")


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


def test_given_make_demos_python_it_says_its_torch_is_the_cpu_build() -> None:
    """After `make demo` on a GPU host, .venv's Python has the CPU build of torch: the
    check names that Python and says so, rather than "no CUDA device here" alone."""
    done = subprocess.run(["make", "--no-print-directory", "gpu-check",
                           f"GPU_PYTHON={sys.executable}"], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 2
    assert f"{sys.executable}: torch {torch_version()} is a CPU build" in done.stderr


def test_it_runs_under_the_python_whose_torch_sees_a_gpu(tmp_path) -> None:
    """This Python's torch is the CPU build; `python3` on PATH is a node's CUDA Python
    (its GPU faked at the edge, tests/helpers/fake_cuda): the check picks it and says
    why it did not take this one."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    cuda_python = bin_dir / "python3"
    gpus = json.dumps([{"uuid": "GPU-00000000-0000-4000-8000-000000000042",
                        "name": "NVIDIA H200 (fake)", "cc": "9.0"}])
    cuda_python.write_text(
        "#!/bin/sh\n"
        f"PYTHONPATH={FAKE_CUDA}${{PYTHONPATH:+:$PYTHONPATH}} "
        f"NUMPARITY_TEST_FAKE_GPUS='{gpus}' exec {sys.executable} \"$@\"\n")
    cuda_python.chmod(0o755)
    env = _env(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    done = subprocess.run([sys.executable, "tools/gpu_check.py", "--which-python"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(cuda_python)
    assert f"under {cuda_python}: torch {torch_version()}" in done.stderr
    assert f"passed over {sys.executable}: torch {torch_version()} is a CPU build" \
        in done.stderr


def torch_version() -> str:
    import torch

    return str(torch.__version__)


def test_without_the_server_packages_or_wheels_it_says_how_to_get_them(tmp_path) -> None:
    env = _env(PYTHONPATH=str(ALONE), NUMPARITY_GPU_CHECK_WHEELS=str(tmp_path / "none"),
               NUMPARITY_GPU_CHECK_FAKE="1")
    done = subprocess.run([sys.executable, "tools/gpu_check.py"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 2
    assert "numparity_server" in done.stderr and "make wheels" in done.stderr
