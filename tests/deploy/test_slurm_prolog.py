"""deploy/slurm/numparity-check.sh as the Prolog and the HealthCheckProgram of a real
Slurm (tests/helpers/slurm.py: Debian's slurmctld and slurmd, munge, on loopback; four
fake GPUs as gres), with the lines of deploy/slurm/slurm.conf.numparity, for real `srun`
and `sbatch` jobs and slurmd's own health checks of an idle node.

slurmd gives the prolog the job's SLURM_JOB_GPUS *and* CUDA_VISIBLE_DEVICES, and no
PATH. The agent is the real one in a "node's ML environment" (a wrapper that puts the
agent's fake CUDA at the edge: GPU 3 of the four crashes when it computes), against a
live server holding a pin of this GPU model's answers. One cluster and one server serve
the module; each test sets what the prolog uses (the file the prolog wrapper reads) and
leaves the node as it found it.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from helpers.agent import clean_env, fake_gpu, fake_gpu_env, run_agent
from helpers.processes import run_cli, start_server, stop_process, wait_ready
from helpers.slurm import Slurm, node_name, require_slurm, start_slurm

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "slurm" / "numparity-check.sh"
CONF_LINES = ROOT / "deploy" / "slurm" / "slurm.conf.numparity"
NUMERIC_ENV = ROOT / "deploy" / "numeric.env"
# GPU 3 takes its process down when asked to compute (as a failing GPU would).
GPUS = [fake_gpu(50), fake_gpu(51), fake_gpu(52), fake_gpu(53, crash=True)]
# The check's budget, and slurmd's limit on the prolog above it (the shipped 60 and 90
# assume a node that is not also running a test suite on two cores).
BUDGET_S = 240
PROLOG_TIMEOUT_S = BUDGET_S + 60
# How often slurmctld asks slurmd for a health check of an idle node (3600 shipped); the
# health check's own budget is the script's (45 s: slurmd kills it at 60 s).
HEALTH_CHECK_INTERVAL_S = 5


def _numeric_env() -> dict[str, str]:
    return dict(line.split("=", 1) for line in NUMERIC_ENV.read_text().splitlines()
                if line and not line.startswith("#"))


def _agent_wrapper(path: Path, record: Path) -> None:
    """The agent of the node's ML environment: the real agent, with the fake GPUs and a
    record of what it was asked and answered (per job), and nothing else of ours: the
    prolog's environment is slurmd's."""
    fake = fake_gpu_env(GPUS)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"""#!/bin/bash
export PYTHONPATH={shlex.quote(fake['PYTHONPATH'])}
export NUMPARITY_TEST_FAKE_GPUS={shlex.quote(fake['NUMPARITY_TEST_FAKE_GPUS'])}
output=$({shlex.quote(sys.executable)} -m numparity_agent "$@" 2>&1)
code=$?
{{ echo "PATH=${{PATH-unset}} CUDA_VISIBLE_DEVICES=${{CUDA_VISIBLE_DEVICES-unset}}"
   echo "ARGS $*"; printf '%s\\n' "$output"; echo "EXIT $code"; }} \\
    > {shlex.quote(str(record))}/"${{SLURM_JOB_ID:-health}}"
printf '%s\\n' "$output"
exit $code
""")
    path.chmod(0o755)


def _health_wrapper(path: Path, armed: Path, record: Path) -> None:
    """slurmd's HealthCheckProgram: the shipped script, with the settings the test armed
    it with, once per arming (slurmd calls it every few seconds while the node is idle);
    else nothing. It records the script's stderr and exit code, and what slurmd gave it."""
    taken = armed.with_name("health.taken")
    path.write_text(f"""#!/bin/bash
/bin/mv {shlex.quote(str(armed))} {shlex.quote(str(taken))} 2>/dev/null || exit 0
{{ declare -p PATH 2>&1; echo "SLURMD_NODENAME=${{SLURMD_NODENAME-unset}}"
   echo "SLURM_JOB_ID=${{SLURM_JOB_ID-unset}} SLURM_CONF=${{SLURM_CONF-unset}}"
}} > {shlex.quote(str(record))}/health-env
set -a; . {shlex.quote(str(taken))}; set +a
/bin/bash {shlex.quote(str(SCRIPT))} 2> {shlex.quote(str(record))}/health-stderr
echo $? > {shlex.quote(str(record))}/health-exit.part
/bin/mv {shlex.quote(str(record))}/health-exit.part {shlex.quote(str(record))}/health-exit
""")
    path.chmod(0o755)


def _measure(node: str, document: Path) -> subprocess.CompletedProcess[str]:
    """One run of this node's GPU 1 (mlp, strict): the answers every fake A100 must give."""
    return run_agent("run", "--node", node, "--workloads", "mlp", "--variants", "strict",
                     "--repeats", "1", "--device", "cuda:1", "--output", str(document),
                     env=fake_gpu_env(GPUS, **_numeric_env()), timeout=600)


def _upload_and_pin(document: Path, server_url: str, database_url: str, tmp: Path,
                    agent_token: str) -> None:
    spool = tmp / "seed-spool"
    spool.mkdir()
    (spool / document.name).write_bytes(document.read_bytes())
    done = run_agent("flush", "--server", server_url, "--spool", str(spool),
                     env=clean_env(NUMPARITY_TOKEN=agent_token))
    assert done.returncode == 0, done.stderr
    run_id = json.loads(document.read_text())["run_id"]
    run_cli("golden", "pin", "--from-run", run_id, "--device", "cuda:1", "--reason",
            "validated", "--by", "lab-admin", database_url=database_url)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    require_slurm()
    pytest.importorskip("numparity_server")
    tmp = tmp_path_factory.mktemp("slurm-lab")
    node = node_name()
    # The measurement (torch in children: the longest part) while the rest starts.
    pool = ThreadPoolExecutor(max_workers=1)
    measured = pool.submit(_measure, node, tmp / "seed.json")
    database_url = f"sqlite:///{tmp / 'numparity.db'}"
    run_cli("migrate", database_url=database_url)
    env = {**os.environ, "NUMPARITY_DATABASE_URL": database_url,
           "NUMPARITY_MIGRATE_ON_START": "false"}
    server, base_url = start_server(tmp / "server.log", env, "--log-level", "warning")
    cluster: Slurm | None = None
    try:
        record = tmp / "record"
        record.mkdir()
        agent = tmp / "ml" / "bin" / "numparity-agent"
        _agent_wrapper(agent, record)
        # The prolog: the shipped script, with the settings of the test at hand (the
        # file /etc/numparity/check.env would hold) and slurmd's environment otherwise.
        settings = tmp / "check.env"
        settings.write_text("NUMPARITY_AGENT=/bin/true\n")
        prolog = tmp / "prolog"
        prolog.write_text(f"#!/bin/bash\nset -a; . {settings}; set +a\n"
                          f"exec /bin/bash {SCRIPT}\n")
        prolog.chmod(0o755)
        health = tmp / "health"
        _health_wrapper(health, tmp / "health.armed", record)
        lines = [line for line in CONF_LINES.read_text().splitlines()
                 if line and not line.startswith("#")]
        conf = "\n".join(lines).replace(
            "Prolog=/etc/slurm/numparity-check.sh", f"Prolog={prolog}").replace(
            "HealthCheckProgram=/etc/slurm/numparity-check.sh",
            f"HealthCheckProgram={health}").replace(
            "PrologEpilogTimeout=90", f"PrologEpilogTimeout={PROLOG_TIMEOUT_S}").replace(
            "HealthCheckInterval=3600", f"HealthCheckInterval={HEALTH_CHECK_INTERVAL_S}")
        for line in (f"Prolog={prolog}", f"HealthCheckProgram={health}",
                     f"PrologEpilogTimeout={PROLOG_TIMEOUT_S}", "HealthCheckNodeState=IDLE",
                     f"HealthCheckInterval={HEALTH_CHECK_INTERVAL_S}"):
            assert line in conf.splitlines(), (line, conf)
        cluster = start_slurm(tmp / "slurm", node=node, gpus=len(GPUS), conf_lines=conf)
        # GPU 0 held by a job of its own (its prolog is /bin/true): the next job gets GPU 1.
        # It also keeps the node from being idle, when slurmd's health checks run.
        holder = _hold_gpu_0(cluster)

        wait_ready(base_url, server, tmp / "server.log", timeout=60)
        token = run_cli("token", "create", "--role", "agent", "--node", node, "--label",
                        "slurm", database_url=database_url).stdout.strip()
        done = measured.result()
        assert done.returncode == 0, done.stderr
        _upload_and_pin(tmp / "seed.json", base_url, database_url, tmp, token)
        token_file = tmp / "agent.token"
        token_file.write_text(token + "\n")
        token_file.chmod(0o600)
        config = tmp / "agent.toml"
        config.write_text(f'server = "{base_url}"\ntoken_file = "{token_file}"\n')
        # slurm.conf is not at Slurm's default path here: slurmd gives the health check no
        # SLURM_CONF (the prolog gets it), so check.env names it, as the page says.
        settings.write_text(f"NUMPARITY_AGENT={agent}\nNUMPARITY_CONFIG={config}\n"
                            f"NUMPARITY_NUMERIC_ENV={NUMERIC_ENV}\n"
                            f"NUMPARITY_CHECK_SECONDS={BUDGET_S}\n"
                            f"SLURM_CONF={cluster.conf}\n")
        yield {"cluster": cluster, "settings": settings, "record": record, "agent": agent,
               "config": config, "base_url": base_url, "tmp": tmp, "holder": holder}
    finally:
        pool.shutdown(wait=True)
        if cluster is not None:
            cluster.stop()
        stop_process(server)


def _hold_gpu_0(cluster: Slurm) -> str:
    """A job holding GPU 0 (the first free one) until cancelled: its id."""
    held = cluster.run("sbatch", "--parsable", "--gres=gpu:1", "--output=/dev/null",
                       "--wrap", "sleep 1800")
    assert held.returncode == 0, held.stderr
    job_id = held.stdout.strip()
    cluster.wait_job(job_id, lambda job: job.get("JobState") == "RUNNING")
    return job_id


def _record(lab: dict[str, Any], job_id: str) -> str:
    path = lab["record"] / job_id
    return path.read_text() if path.exists() else ""


def _srun(lab: dict[str, Any], gpus: int) -> tuple[int, str, str, str]:
    """srun a job of `gpus` GPUs that prints the GPUs it got: (exit, job id, its GPUs,
    srun's stderr: "queued and waiting for resources" while the last job's end is
    still being cleaned up)."""
    done = lab["cluster"].run(
        "srun", f"--gres=gpu:{gpus}", "bash", "-c",
        'echo "$SLURM_JOB_ID ${SLURM_STEP_GPUS:-$CUDA_VISIBLE_DEVICES}"',
        timeout=BUDGET_S + 60)
    job_id, _, job_gpus = done.stdout.strip().partition(" ")
    return done.returncode, job_id, job_gpus, done.stderr


def test_a_job_on_gpu_1_and_on_gpus_1_2_checks_those_gpus_and_starts(
        lab: dict[str, Any]) -> None:
    cluster = lab["cluster"]
    code, job_id, job_gpus, stderr = _srun(lab, 1)
    record = _record(lab, job_id)
    assert code == 0 and job_gpus == "1", (job_gpus, stderr, record)
    # slurmd showed the prolog GPU 1 alone (as cuda:0), and no PATH of its own.
    assert "CUDA_VISIBLE_DEVICES=1" in record
    assert "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin " in record
    assert "--device cuda:0" in record and "EXIT 0" in record
    (line,) = [line for line in record.splitlines() if line.startswith("cuda:")]
    assert GPUS[1]["uuid"] in line and ": go — 1 of 1 answer(s) as pinned" in line, record

    code, job_id, job_gpus, stderr = _srun(lab, 2)
    record = _record(lab, job_id)
    assert code == 0 and job_gpus == "1,2", (job_gpus, stderr, record)
    assert "CUDA_VISIBLE_DEVICES=1,2" in record and "--device cuda:0,cuda:1" in record
    lines = dict(line.split(" ", 1) for line in record.splitlines()
                 if line.startswith("cuda:"))
    assert GPUS[1]["uuid"] in lines["cuda:0"] and GPUS[2]["uuid"] in lines["cuda:1"]
    assert all(": go — " in line for line in lines.values()), record
    assert "DRAIN" not in cluster.node_state()[0]


def test_a_failing_gpu_drains_the_node_naming_it_and_the_job_is_requeued(
        lab: dict[str, Any]) -> None:
    cluster = lab["cluster"]
    submitted = cluster.run("sbatch", "--parsable", "--gres=gpu:3", "--output=/dev/null",
                            "--wrap", "true")
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    try:
        job = cluster.wait_job(job_id, lambda job: job.get("Restarts", "0") != "0",
                               timeout=BUDGET_S + 60)
        record = _record(lab, job_id)
        assert "CUDA_VISIBLE_DEVICES=1,2,3" in record and "EXIT 13" in record, record
        state, reason = cluster.node_state()
        assert "DRAIN" in state
        # Slurm's GPU 3 is the prolog's cuda:2: the reason names both, and its UUID.
        assert reason.startswith(f"numparity: GPU 3: cuda:2 (NVIDIA A100-SXM4-80GB, "
                                 f"{GPUS[3]['uuid']}): NO-GO"), reason
        # Requeued and waiting for another node, not held (nohold_on_prolog_fail).
        assert job["JobState"] == "PENDING" and job["Priority"] != "0", job
        assert "held" not in job.get("Reason", "").lower(), job
    finally:
        cluster.run("scancel", job_id)
        cluster.resume()


@pytest.mark.parametrize("case", ["no agent", "server unreachable", "token refused"])
def test_fail_open_never_drains(lab: dict[str, Any], case: str, tmp_path: Path) -> None:
    cluster, settings = lab["cluster"], lab["settings"]
    saved = settings.read_text()
    config = tmp_path / "agent.toml"
    agent = lab["agent"]
    if case == "no agent":
        agent = tmp_path / "not-installed" / "numparity-agent"
        config = lab["config"]
    elif case == "server unreachable":
        config.write_text('server = "http://127.0.0.1:9"\ntoken = "np_unused"\n')
    else:
        config.write_text(f'server = "{lab["base_url"]}"\ntoken = "np_refused"\n')
    settings.write_text(saved.replace(f"NUMPARITY_AGENT={lab['agent']}",
                                      f"NUMPARITY_AGENT={agent}")
                        .replace(f"NUMPARITY_CONFIG={lab['config']}",
                                 f"NUMPARITY_CONFIG={config}"))
    try:
        code, job_id, job_gpus, stderr = _srun(lab, 1)
        assert code == 0, (job_gpus, stderr)
        assert "DRAIN" not in cluster.node_state()[0], cluster.node_state()
        record = _record(lab, job_id)
        if case == "no agent":
            assert record == ""
        else:
            assert "go (fail-open)" in record and "EXIT 0" in record, record
    finally:
        settings.write_text(saved)
        if "DRAIN" in cluster.node_state()[0]:
            cluster.resume()



# ---- the HealthCheckProgram: slurmd's own checks of an idle node -------------------------


def _health_check(lab: dict[str, Any], settings: str) -> tuple[int, str, str, str]:
    """The next health check slurmd runs, with `settings` (check.env's lines): (the
    script's exit code, its stderr, the agent's record, what slurmd gave the program).
    The node is idle for it (HealthCheckNodeState=IDLE): GPU 0's job is cancelled first."""
    cluster, record, tmp = lab["cluster"], lab["record"], lab["tmp"]
    for name in ("health", "health-exit", "health-stderr", "health-env"):
        (record / name).unlink(missing_ok=True)
    part = tmp / "health.armed.part"
    part.write_text(settings)
    part.rename(tmp / "health.armed")
    cancelled = cluster.run("scancel", lab["holder"])
    assert cancelled.returncode == 0, cancelled.stderr
    # slurmd kills a health check at 60 s; slurmctld asks for one every few seconds.
    deadline = time.monotonic() + HEALTH_CHECK_INTERVAL_S + 60 + 60
    while not (record / "health-exit").exists():
        assert time.monotonic() < deadline, (
            "no health check ended (killed by slurmd at 60 s?)\n"
            + (cluster.root / "slurmd.log").read_text(errors="replace")[-3000:]
            + _record(lab, "health"))
        time.sleep(0.5)
    return (int((record / "health-exit").read_text()),
            (record / "health-stderr").read_text(), _record(lab, "health"),
            (record / "health-env").read_text())


@pytest.fixture
def idle_node(lab: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The lab, left as found after a health check: not armed, not drained, GPU 0 held."""
    yield lab
    (lab["tmp"] / "health.armed").unlink(missing_ok=True)
    cluster = lab["cluster"]
    if "DRAIN" in cluster.node_state()[0]:
        cluster.resume()
    lab["holder"] = _hold_gpu_0(cluster)


def test_the_health_check_drains_an_idle_node_whose_gpu_fails(
        idle_node: dict[str, Any]) -> None:
    lab = idle_node
    code, stderr, record, given = _health_check(lab, lab["settings"].read_text())
    # slurmd gave the program no job and no PATH; the script checked every GPU, with the
    # health check's budget (not the prolog's 240 s of the same check.env).
    assert f"SLURMD_NODENAME={lab['cluster'].node}" in given
    assert "SLURM_JOB_ID=unset SLURM_CONF=unset" in given, given
    assert "declare -x PATH" not in given, given
    assert "CUDA_VISIBLE_DEVICES=unset" in record and "--device" not in record, record
    assert "--max-seconds 45 " in record and "EXIT 13" in record, record
    lines = dict(line.split(" ", 1) for line in record.splitlines()
                 if line.startswith("cuda:"))
    assert all(": go — " in lines[f"cuda:{i}"] for i in range(3)), record
    # Drained, naming the GPU; exit 0 (slurmd ignores a health check's code).
    assert code == 0, stderr
    state, reason = lab["cluster"].node_state()
    assert "DRAIN" in state, (state, stderr)
    assert reason.startswith(f"numparity: cuda:3 (NVIDIA A100-SXM4-80GB, "
                             f"{GPUS[3]['uuid']}): NO-GO"), reason


def test_the_health_check_fails_open_without_draining(idle_node: dict[str, Any],
                                                      tmp_path: Path) -> None:
    lab = idle_node
    config = tmp_path / "agent.toml"
    config.write_text('server = "http://127.0.0.1:9"\ntoken = "np_unused"\n')
    settings = lab["settings"].read_text().replace(f"NUMPARITY_CONFIG={lab['config']}",
                                                   f"NUMPARITY_CONFIG={config}")
    code, stderr, record, _given = _health_check(lab, settings)
    assert "go (fail-open)" in record and "EXIT 0" in record, record
    assert code == 0 and "not drained" not in stderr, stderr
    assert "DRAIN" not in lab["cluster"].node_state()[0], lab["cluster"].node_state()
