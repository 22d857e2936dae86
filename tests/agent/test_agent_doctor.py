"""`numparity-agent doctor`: each warning provoked, each ok path where the node allows.

The node is changed at its edges only: environment variables, torch's knob getters
(monkeypatched and restored), and fake GPUs (torch.cuda answering as an A100/V100).
A `warn` is something the node can fix (it fails `--strict`); a `fact` holds in every
fresh process or for a number format (it never does).
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.agent import A100, NUMERIC_PREFIXES, V100, clean_env, run_agent

from numparity_agent._doctor import _check_fp16_eps, diagnose, fp16_underflows, tf32_in_force
from numparity_agent.testing import capture_environment

ITEMS = [
    "seeds",
    "deterministic_algorithms",
    "cudnn",
    "tf32",
    "cublas_workspace",
    "threads",
    "mkl_cbwr",
    "dataloader_workers",
    "fp16_eps",
]


@pytest.fixture(autouse=True)
def bare_node(monkeypatch):
    """No numeric environment variable set, no PYTHONHASHSEED: the node's defaults."""
    for name in list(os.environ):
        if name.startswith(NUMERIC_PREFIXES) or name in (
            "PYTHONHASHSEED",
            "CUBLAS_WORKSPACE_CONFIG",
            "NVIDIA_TF32_OVERRIDE",
        ):
            monkeypatch.delenv(name)
    monkeypatch.setitem(__import__("sys").modules, "pynvml", None)  # no NVML here


def gpus(monkeypatch, *cards):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(cards))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: cards[index])


def check(name, environment=None):
    """The doctor's item `name` for the node as it is now (or for `environment`)."""
    checks = {c.name: c for c in diagnose(environment=environment)}
    assert list(checks) == ITEMS
    return checks[name]


def test_seeds_warn_without_pythonhashseed():
    item = check("seeds")
    assert item.status == "warn" and "PYTHONHASHSEED is unset" in item.message
    assert "the agent seeds its strict variant" in item.message
    assert "torch.manual_seed" in item.fix and "numpy.random.seed" in item.fix


def test_seeds_ok_with_pythonhashseed(monkeypatch):
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    item = check("seeds")
    assert item.status == "ok" and "must still seed" in item.message
    for random_seed in ("", "random"):  # both mean a random seed to Python
        monkeypatch.setenv("PYTHONHASHSEED", random_seed)
        assert check("seeds").status == "warn"


def test_deterministic_algorithms_off_by_default_is_a_fact_of_every_process():
    item = check("deterministic_algorithms")
    assert item.status == "fact" and "every fresh process" in item.message
    assert item.fix.startswith("torch.use_deterministic_algorithms(True)")


def test_deterministic_algorithms_on_is_ok_and_warn_only_is_not(monkeypatch):
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: True)
    monkeypatch.setattr(torch, "is_deterministic_algorithms_warn_only_enabled", lambda: False)
    assert check("deterministic_algorithms").status == "ok"
    monkeypatch.setattr(torch, "is_deterministic_algorithms_warn_only_enabled", lambda: True)
    item = check("deterministic_algorithms")
    assert item.status == "warn" and "warn-only" in item.message


def test_cudnn_benchmark_on_warns(monkeypatch):
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)
    item = check("cudnn")
    assert item.status == "warn" and "torch.backends.cudnn.benchmark = False" in item.fix
    assert "start-up code" in item.message


def test_cudnn_on_a_gpu_node_needs_deterministic_in_code(monkeypatch):
    gpus(monkeypatch, V100)
    item = check("cudnn")
    assert item.status == "fact" and "cudnn.deterministic = True" in item.fix
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    assert check("cudnn").status == "ok"


def test_cudnn_ok_on_a_cpu_node():
    assert check("cudnn").status == "ok"


def test_tf32_convolutions_on_ampere_are_torchs_default_a_fact(monkeypatch):
    gpus(monkeypatch, A100, V100)
    item = check("tf32")
    # torch's default: fp32 convolutions in TF32 (cuDNN), matmuls in IEEE fp32.
    assert tf32_in_force(capture_environment()["knobs"]) == {"matmul": False, "conv": True}
    assert item.status == "fact"
    assert "conv" in item.message and "NVIDIA A100-SXM4-80GB (cc 8.0)" in item.message
    assert "V100" not in item.message
    assert 'cudnn.conv.fp32_precision = "ieee"' in item.fix


def test_tf32_matmul_precision_high_counts_as_tf32(monkeypatch):
    gpus(monkeypatch, A100)
    environment = capture_environment()
    environment["knobs"].update(
        {"cuda.matmul.fp32_precision": "none", "cudnn.conv.fp32_precision": "ieee"}
    )
    environment["knobs"]["float32_matmul_precision"] = "high"
    item = check("tf32", environment)
    assert item.status == "warn" and "matmul" in item.message and "conv" not in item.message


def test_tf32_ok_on_ampere_when_off_and_on_older_gpus(monkeypatch):
    gpus(monkeypatch, A100)
    environment = capture_environment()  # as a node that turned TF32 off would report
    environment["knobs"].update(
        {"cuda.matmul.fp32_precision": "ieee", "cudnn.conv.fp32_precision": "ieee"}
    )
    assert check("tf32", environment).status == "ok"
    gpus(monkeypatch, V100)
    item = check("tf32")
    assert item.status == "ok" and "TF32 does not exist" in item.message


def test_tf32_unreadable_after_mixed_apis_warns(monkeypatch):
    gpus(monkeypatch, A100)
    environment = capture_environment()
    # What a process that mixed the APIs reports: the tree says inherit, legacy raised.
    for name in ("fp32_precision", "cuda.matmul.fp32_precision"):
        environment["knobs"][name] = "none"
    environment["knobs"]["cudnn.conv.fp32_precision"] = "ieee"
    del environment["knobs"]["cuda.matmul.allow_tf32"]
    item = check("tf32", environment)
    assert item.status == "warn" and "cannot tell" in item.message


def test_nvidia_tf32_override_warns(monkeypatch):
    monkeypatch.setenv("NVIDIA_TF32_OVERRIDE", "0")
    item = check("tf32")
    assert item.status == "warn" and "NVIDIA_TF32_OVERRIDE=0" in item.message


def test_cpu_reduced_precision_matmul_on_amx_warns(monkeypatch):
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "medium")
    environment = capture_environment()
    environment["cpu"]["flags"] = "amx_bf16 amx_tile avx512f"  # any machine: an AMX CPU
    item = check("tf32", environment)
    assert item.status == "warn" and "'medium'" in item.message and "bf16" in item.message


def test_cpu_tf32_ok_at_highest_and_without_amx():
    environment = capture_environment()
    environment["cpu"]["flags"] = "amx_bf16 avx512f"
    item = check("tf32", environment)
    assert item.status == "ok" and "'medium'/'high'" in item.message
    environment["cpu"]["flags"] = "avx2"
    assert check("tf32", environment).status == "ok"


def test_cublas_workspace_unset_on_a_cuda_node_warns(monkeypatch):
    gpus(monkeypatch, A100)
    item = check("cublas_workspace")
    assert item.status == "warn" and ":4096:8" in item.fix
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":0:0")
    assert check("cublas_workspace").status == "warn"
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    assert check("cublas_workspace").status == "ok"


def test_cublas_workspace_ok_on_a_cpu_node():
    assert check("cublas_workspace").status == "ok"


def test_threads_unpinned_warn_and_pinned_ok(monkeypatch):
    item = check("threads")
    assert item.status == "warn" and "OMP_NUM_THREADS" in item.fix
    assert f"{os.cpu_count()} logical CPUs" in item.message
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert check("threads").status == "ok"


def test_threads_other_than_the_configured_ones_warn(monkeypatch):
    """Issue 40 finding 11: OMP_NUM_THREADS=8 while torch computes with 2 threads passed
    `doctor --strict`."""
    from numparity_agent._environment import capture_environment

    monkeypatch.setenv("OMP_NUM_THREADS", "8")
    environment = capture_environment()
    environment["threads"]["num_threads"] = 2  # what torch said in the measured process
    item = check("threads", environment)
    assert item.status == "warn"
    assert "OMP_NUM_THREADS=8, but torch uses 2 thread(s)" in item.message


@pytest.mark.skipif(not torch.backends.mkl.is_available(), reason="torch built without MKL")
def test_mkl_cbwr_unset_on_an_mkl_build_warns(monkeypatch):
    item = check("mkl_cbwr")
    assert item.status == "warn" and "MKL_CBWR=COMPATIBLE" in item.fix
    monkeypatch.setenv("MKL_CBWR", "COMPATIBLE")
    assert check("mkl_cbwr").status == "ok"
    monkeypatch.setenv("MKL_CBWR", "AUTO")  # MKL's default: the path still follows the CPU
    item = check("mkl_cbwr")
    assert item.status == "warn" and "MKL_CBWR=AUTO is MKL's default" in item.message


def test_mkl_cbwr_ok_without_mkl(monkeypatch):
    monkeypatch.setattr(torch.backends.mkl, "is_available", lambda: False)
    assert check("mkl_cbwr").status == "ok"


def test_the_dataloader_check_is_measured_with_real_workers():
    """The built-in pipeline measured here: its dataset's own numpy Generator repeats in
    every worker without the recipe, and the recipe holds on this node."""
    item = check("dataloader_workers")
    assert item.status == "fact", item.message
    assert item.message.startswith("measured here with num_workers 0, 2")
    assert "jitter repeats in workers 0, 1 (num_workers=2)" in item.message
    assert "with the seeds' recipe the order and batches are the same in every run" \
        in item.message
    assert "worker_init_fn" in item.fix and "generator=torch.Generator()" in item.fix
    if torch.initial_seed() != 67280421310721:  # this torch seeds from the OS at start
        assert "seeds from the operating system in every process" in item.message


def test_doctor_measures_a_labs_pipeline_and_names_what_defeats_the_recipe():
    proc = run_agent("doctor", "--pipeline", "agent_test_data_factories:duplicating")
    assert proc.returncode == 0, proc.stderr
    (line,) = [line for line in proc.stdout.splitlines() if "pipeline agent_test" in line]
    assert line.startswith("[warn] pipeline agent_test_data_factories:duplicating: measured")
    assert "even with the seeds' recipe offset repeats in workers 0, 1" in line
    proc = run_agent("doctor", "--json", "--pipeline", "agent_test_data_factories:held")
    (item,) = [c for c in json.loads(proc.stdout)["checks"] if c["name"].startswith("pipe")]
    assert item["status"] == "ok" and "as built the order and batches are the same" in \
        item["message"]
    proc = run_agent("doctor", "--pipeline", "no-colon")
    assert proc.returncode == 2 and "module:factory" in proc.stderr


def test_fp16_eps_underflow_is_computed():
    # Oracle: IEEE half in numpy. 1e-8 is below half the smallest subnormal (2**-24).
    assert bool(np.float16(1e-8) == 0) and fp16_underflows(1e-8)
    assert not np.float16(1e-4) == 0 and not fp16_underflows(1e-4)
    item = check("fp16_eps")
    assert item.status == "fact" and "rounds to 0" in item.message
    assert _check_fp16_eps({}, {}, eps=1e-4).status == "ok"


def test_doctor_command_text_json_and_strict():
    env = clean_env()
    env.pop("PYTHONHASHSEED", None)
    proc = run_agent("doctor", env=env)
    assert proc.returncode == 0, proc.stderr
    for name in ITEMS:
        assert f"] {name}: " in proc.stdout
    assert "[warn] seeds:" in proc.stdout and "fix: " in proc.stdout

    proc = run_agent("doctor", "--json", env=clean_env(OMP_NUM_THREADS="1", MKL_CBWR="AVX2"))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    assert list(statuses) == ITEMS
    assert statuses["threads"] == "ok" and statuses["mkl_cbwr"] == "ok"
    assert statuses["deterministic_algorithms"] == "fact" and statuses["fp16_eps"] == "fact"
    assert report["warnings"] == sum(s == "warn" for s in statuses.values())
    assert report["facts"] == sum(s == "fact" for s in statuses.values())

    proc = run_agent("doctor", "--strict", env=env)
    assert proc.returncode == 1  # PYTHONHASHSEED is unset: the node can fix that
    assert "[warn] seeds:" in proc.stdout


# --- a node set up as the README says ----------------------------------------------------

REPO = Path(__file__).resolve().parents[2]
# What the README's recipe sets; the tests start from a node without any of it.
RECIPE_NAMES = ("PYTHONHASHSEED", "CUBLAS_WORKSPACE_CONFIG", "NVIDIA_TF32_OVERRIDE",
                "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE")


def quick_start_agent_block() -> str:
    """The README's quick start, the agent's shell block."""
    readme = (REPO / "README.md").read_text()
    section = re.split(r"\n##+ ", readme.split("## Lab quick start", 1)[1], maxsplit=1)[0]
    (block,) = [b for b in re.findall(r"```sh\n(.*?)```", section, re.S)
                if "/etc/numparity/numeric.env <<'EOF'" in b]
    return block


def recipe_script(etc: Path, numeric_env: str | None = None) -> str:
    """The quick start's lines that write the numeric settings and run the doctor, for a
    node whose /etc/numparity is `etc` and whose agent is this checkout's."""
    block = quick_start_agent_block()
    write = re.search(r"^install -m 644 /dev/stdin /etc/numparity/numeric.env <<'EOF'\n"
                      r"(.*?)^EOF\n", block, re.S | re.M)
    assert write, block
    (doctor,) = [line for line in block.splitlines() if "numparity-agent doctor" in line]
    if numeric_env is None:
        numeric_env = write.group(1)
    # The README's 8 threads are for nodes of 8 cores or more; torch uses no more than
    # the CPUs it may run on, and doctor warns when it computes with another count than
    # the one configured: this machine's count, as a lab sets its smallest node's.
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    numeric_env = numeric_env.replace("_NUM_THREADS=8\n", f"_NUM_THREADS={usable}\n")
    script = f"install -m 644 /dev/stdin /etc/numparity/numeric.env <<'EOF'\n{numeric_env}EOF\n"
    script += doctor + "\n"
    return (script.replace("/etc/numparity", str(etc))
            .replace("/opt/ml/bin/numparity-agent", "numparity-agent")
            .replace("numparity-agent", f"{sys.executable} -m numparity_agent"))


def node_env() -> dict[str, str]:
    env = clean_env()
    for name in RECIPE_NAMES:
        env.pop(name, None)
    return env


def test_the_readme_recipe_writes_the_settings_of_deploy_numeric_env():
    def settings(text):
        return [line for line in text.splitlines() if line and not line.startswith("#")]

    block = quick_start_agent_block()
    shipped = settings((REPO / "deploy" / "numeric.env").read_text())
    assert shipped == settings(block.split("<<'EOF'\n", 1)[1].split("\nEOF\n", 1)[0])
    # Every place the README or the manual starts the agent from cron, it starts it with
    # those settings: the quick start, the lab's page and the fleet guide at least.
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    runs = [(page.relative_to(REPO), line) for page in pages
            for line in re.findall(r"^0 \* \* \* \* .*numparity-agent run.*$",
                                   page.read_text(encoding="utf-8"), re.M)]
    assert {str(page) for page, _line in runs} >= {
        "README.md", "docs/getting-started/lab.md", "docs/how-to/agent-fleet.md"}, runs
    for page, line in runs:
        assert "set -a; . /etc/numparity/numeric.env; " in line, (page, line)
    unit = (REPO / "deploy" / "systemd" / "numparity-agent.service").read_text()
    assert re.search(r"^EnvironmentFile=/etc/numparity/numeric.env$", unit, re.M)


def test_a_node_set_up_per_the_readme_passes_doctor_strict(tmp_path):
    done = subprocess.run(["sh", "-c", recipe_script(tmp_path)], env=node_env(),
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 warning(s) to fix on this node" in done.stdout
    assert "[fact] deterministic_algorithms:" in done.stdout  # still said, never failing
    assert "[fact] fp16_eps:" in done.stdout


@pytest.mark.parametrize(("edit", "named"), [
    (("OMP_NUM_THREADS=8\nMKL_NUM_THREADS=8\n", ""), "OMP_NUM_THREADS"),
    (("PYTHONHASHSEED=0\n", ""), "PYTHONHASHSEED"),
    (("MKL_CBWR=COMPATIBLE", "MKL_CBWR=AUTO"), "MKL_CBWR"),
])
def test_a_broken_setting_fails_doctor_strict_naming_it(tmp_path, edit, named):
    if named == "MKL_CBWR" and not torch.backends.mkl.is_available():
        pytest.skip("torch built without MKL: MKL_CBWR changes nothing")
    block = quick_start_agent_block()
    settings = block.split("<<'EOF'\n", 1)[1].split("\nEOF\n", 1)[0] + "\n"
    assert edit[0] in settings
    script = recipe_script(tmp_path, settings.replace(*edit))
    done = subprocess.run(["sh", "-c", script], env=node_env(), capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 1, done.stdout + done.stderr
    (warning,) = [line for line in done.stdout.splitlines() if line.startswith("[warn]")]
    assert named in warning


# --- a reader that leaves early -----------------------------------------------------------

@pytest.mark.parametrize("args", [("doctor",), ("doctor", "--json"), ("env",)])
def test_a_closed_pipe_ends_quietly(args):
    """`doctor | head -1` when head has gone: no traceback, the SIGPIPE exit status."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader has left before the first byte
    try:
        done = subprocess.run([sys.executable, "-m", "numparity_agent", *args],
                              stdout=write_end, stderr=subprocess.PIPE, env=clean_env(),
                              text=True, timeout=120, check=False)
    finally:
        os.close(write_end)
    assert done.stderr == ""
    assert done.returncode == 141


def test_doctor_piped_into_head_prints_its_first_line_only():
    agent = f"{sys.executable} -m numparity_agent"
    pipeline = f"{agent} doctor | head -1; {agent} doctor --json | head -1"
    done = subprocess.run(["sh", "-c", pipeline], env=clean_env(), capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    first, json_first = done.stdout.splitlines()
    assert first.startswith("numparity doctor: torch ") and json_first == "{"
