"""The preflight's deploy files (issue "Preflight", docs/how-to/preflight.md): the
Kubernetes manifests validated offline against a current Kubernetes release's schema
(strict: an unknown field fails), their structure, every numparity command in them parsed
by the real CLIs; the Slurm prolog/health-check script run with the real agent and with
stand-ins for the agent and scontrol, and its slurm.conf lines."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from helpers.agent import clean_env

from numparity_agent import _cli as agent_cli
from numparity_agent import _config
from numparity_server.cli import _parser as server_parser

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
SLURM = ROOT / "deploy" / "slurm"
SCRIPT = SLURM / "numparity-check.sh"


def manifests() -> list[tuple[str, dict[str, Any]]]:
    return [(path.name, doc) for path in sorted(KUBERNETES.rglob("*.yaml"))
            for doc in yaml.safe_load_all(path.read_text()) if doc]


def by_kind(kind: str) -> list[dict[str, Any]]:
    return [doc for _name, doc in manifests() if doc["kind"] == kind]


def pod_spec(doc: dict[str, Any]) -> dict[str, Any]:
    if doc["kind"] == "CronJob":
        return doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    spec: dict[str, Any] = doc["spec"]["template"]["spec"]
    return spec


def test_every_manifest_is_valid_for_a_current_kubernetes_release() -> None:
    version = kubernetes_validate.latest_version()
    assert tuple(int(p) for p in version.split(".")[:2]) >= (1, 31)
    found = manifests()
    assert {doc["kind"] for _name, doc in found} >= {
        "Deployment", "StatefulSet", "Service", "Job", "CronJob", "DaemonSet", "ConfigMap"}
    for name, doc in found:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            raise AssertionError(f"{name} {doc['kind']}: {exc}") from None
    # The validation is real: a misspelt field or a wrong type is refused.
    broken = yaml.safe_load((KUBERNETES / "server.yaml").read_text().replace(
        "readinessProbe:", "readynessProbe:", 1).split("---")[1])
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, version, strict=True)


def _commands(container: dict[str, Any]) -> list[list[str]]:
    """Every numparity command a container runs, split as the shell would."""
    words = [*container.get("command", []), *container.get("args", [])]
    if words[:2] == ["/bin/sh", "-c"]:
        script = " ".join(words[2:])
        found = []
        for part in re.split(r"[;&|]+", script):
            tokens = shlex.split(part.replace("exec ", " "))
            tokens = [t for t in tokens if t not in ("do", "done", "true", "while")]
            if tokens and tokens[0].startswith("numparity-"):
                found.append(tokens)
        return found
    return [words] if words and words[0].startswith("numparity-") else []


def test_every_numparity_command_parses_with_the_real_cli() -> None:
    seen = set()
    for _name, doc in manifests():
        if doc["kind"] in ("ConfigMap", "Service", "Namespace"):
            continue
        spec = pod_spec(doc)
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            for command in _commands(container):
                program, *args = command
                seen.add((program, args[0]))
                if program == "numparity-server":
                    server_parser().parse_args(args)
                else:
                    agent_cli._parser().parse_args(args)
    assert seen == {("numparity-server", "migrate"), ("numparity-server", "serve"),
                    ("numparity-agent", "run"), ("numparity-agent", "check")}


def test_the_agent_runs_on_gpu_nodes_and_check_gates_the_job(tmp_path: Path) -> None:
    (daemonset,) = by_kind("DaemonSet")
    spec = pod_spec(daemonset)
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in \
        spec["tolerations"]
    (cronjob,) = by_kind("CronJob")
    (agent,) = pod_spec(cronjob)["containers"]
    assert agent["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert "nvidia.com/gpu.product" in pod_spec(cronjob)["nodeSelector"]

    (training,) = [doc for doc in by_kind("Job") if doc["metadata"]["name"] == "train-example"]
    spec = pod_spec(training)
    (check,) = spec["initContainers"]
    (trainer,) = spec["containers"]
    assert _commands(check)[0][:2] == ["numparity-agent", "check"]
    # The init container checks the GPUs the job gets: it asks for as many.
    assert check["resources"]["limits"]["nvidia.com/gpu"] == \
        trainer["resources"]["limits"]["nvidia.com/gpu"]
    assert "nvidia.com/gpu.product" in spec["nodeSelector"]

    # The agent's and the check's config files are ones the agent reads (keys and values
    # checked), with the lab's numeric settings.
    shipped = dict(line.split("=", 1) for line in (ROOT / "deploy" / "numeric.env")
                   .read_text().splitlines() if line and not line.startswith("#"))
    configs = {doc["metadata"]["name"]: doc for doc in by_kind("ConfigMap")}
    assert set(configs) == {"numparity-agent", "numparity-check"}
    for name, config in configs.items():
        path = tmp_path / f"{name}.toml"
        path.write_text(config["data"]["agent.toml"])
        loaded = _config.load_config(path)
        assert loaded["check_fail"] == "open" and loaded["device"] == "all"
        numeric = dict(line.split("=", 1)
                       for line in config["data"]["numeric.env"].splitlines())
        assert numeric == shipped
    # The job's pod reads its own namespace's config.
    assert {v["configMap"]["name"] for v in spec["volumes"] if "configMap" in v} == \
        {"numparity-check"}
    assert configs["numparity-check"]["metadata"]["namespace"] == \
        training["metadata"]["namespace"]


def _kinds(path: Path) -> list[str]:
    return [doc["kind"] for doc in yaml.safe_load_all(path.read_text()) if doc]


def test_the_agent_is_a_daemonset_or_a_cronjob_a_file_each() -> None:
    """Issue 40, finding 10: `kubectl apply -f deploy/kubernetes/` (not recursive) applies
    the server and PostgreSQL only, and the agent's two alternatives are two files, each
    complete alone, of which a lab applies one."""
    top = {path.name: _kinds(path) for path in sorted(KUBERNETES.glob("*.yaml"))}
    assert set(top) == {"postgres.yaml", "server.yaml"}, top
    assert not {"DaemonSet", "CronJob"} & {kind for kinds in top.values() for kind in kinds}
    assert not [path for path in KUBERNETES.rglob("*.yaml")
                if {"DaemonSet", "CronJob"} <= set(_kinds(path))], "both in one file"
    (server,) = by_kind("Deployment")

    files = {"DaemonSet": KUBERNETES / "examples" / "agent-daemonset.yaml",
             "CronJob": KUBERNETES / "examples" / "agent-cronjob.yaml"}
    agents, configs = {}, {}
    for kind, path in files.items():
        docs = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
        assert [doc["kind"] for doc in docs] == ["ConfigMap", kind], path.name
        config, workload = docs
        spec = pod_spec(workload)
        # Alone, the file is complete: every ConfigMap its pod mounts is in it, in the
        # server's namespace.
        mounted = {v["configMap"]["name"] for v in spec["volumes"] if "configMap" in v}
        assert mounted == {config["metadata"]["name"]}, path.name
        assert workload["metadata"]["namespace"] == config["metadata"]["namespace"] == \
            server["metadata"]["namespace"], path.name
        # The other file is named as the alternative.
        other = next(p for k, p in files.items() if k != kind)
        assert f"Apply this file OR {other.name}" in path.read_text(), path.name
        (agents[kind],) = spec["containers"]
        configs[kind] = config
    # The same agent, configured alike, in both: they differ in how they are scheduled.
    assert configs["DaemonSet"] == configs["CronJob"]
    for field in ("image", "volumeMounts"):
        assert agents["DaemonSet"][field] == agents["CronJob"][field], field
    assert [c[:2] for c in _commands(agents["DaemonSet"])] == \
        [c[:2] for c in _commands(agents["CronJob"])] == [["numparity-agent", "run"]]


def _mounted(spec: dict[str, Any], container: dict[str, Any]) -> list[dict[str, Any]]:
    volumes = {volume["name"]: volume for volume in spec.get("volumes", [])}
    return [volumes[mount["name"]] for mount in container.get("volumeMounts", [])]


def test_no_pod_holds_a_token_that_writes_as_another_node() -> None:
    """Issue "A preflight no single node can switch off …", finding 5: one Secret held a
    token that wrote as any node, mounted by every training job's init container."""
    for doc in [*by_kind("DaemonSet"), *by_kind("CronJob")]:
        spec = pod_spec(doc)
        (agent,) = spec["containers"]
        (token,) = [v for v in _mounted(spec, agent) if v["name"] == "token"]
        # The node's own token (bound to its name), on the node: no Secret shared by all.
        assert token == {"name": "token", "hostPath": {
            "path": "/etc/numparity/agent-token", "type": "Directory"}}, doc["kind"]
    for _name, doc in manifests():
        if doc["kind"] in ("DaemonSet", "CronJob", "Job", "Deployment", "StatefulSet"):
            secrets = {v["secret"]["secretName"] for v in pod_spec(doc).get("volumes", [])
                       if "secret" in v}
            assert not any("agent" in name for name in secrets), (doc["kind"], secrets)

    (training,) = [doc for doc in by_kind("Job") if doc["metadata"]["name"] == "train-example"]
    spec = pod_spec(training)
    (check,) = spec["initContainers"]
    (trainer,) = spec["containers"]
    # The init container holds the check token alone; the trainer holds none; no volume
    # of the node is mounted, and the namespace refuses pods that would mount one.
    assert [v.get("secret", {}).get("secretName") for v in _mounted(spec, check)
            if "secret" in v] == ["numparity-check-token"]
    assert not [v for v in _mounted(spec, trainer) if "secret" in v or "hostPath" in v]
    assert not [v for v in spec["volumes"] if "hostPath" in v]
    (namespace,) = [doc for doc in by_kind("Namespace")
                    if doc["metadata"]["name"] == training["metadata"]["namespace"]]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] in (
        "baseline", "restricted")
    # The token it holds is made with the check role: the command shown parses.
    text = (KUBERNETES / "examples" / "training-job.yaml").read_text()
    (made,) = re.findall(r"\$\((numparity-server token create [^)]*)\)", text)
    args = server_parser().parse_args(shlex.split(made)[1:])
    assert args.role == "check" and not args.node and not args.node_pattern


def test_the_server_is_a_deployment_on_postgresql_with_probes() -> None:
    (deployment,) = by_kind("Deployment")
    (server,) = pod_spec(deployment)["containers"]
    assert server["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert server["livenessProbe"]["httpGet"]["path"] == "/healthz"
    env = {e["name"]: e for e in server["env"]}
    assert env["NUMPARITY_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["name"] == \
        "numparity-db-url"
    (database,) = by_kind("StatefulSet")
    (postgres,) = pod_spec(database)["containers"]
    assert postgres["image"].startswith("postgres:")
    assert "secretKeyRef" in {e["name"]: e for e in postgres["env"]}["POSTGRES_PASSWORD"][
        "valueFrom"]
    text = "".join(p.read_text() for p in KUBERNETES.rglob("*.yaml"))
    assert "password:" not in text.replace("--from-literal=password", "")


# ---- Slurm --------------------------------------------------------------------------


def slurm_conf() -> dict[str, str]:
    return dict(line.split("=", 1) for line in (SLURM / "slurm.conf.numparity").read_text()
                .splitlines() if line.strip() and not line.startswith("#"))


def test_the_slurm_conf_lines() -> None:
    conf = slurm_conf()
    assert set(conf) == {"Prolog", "PrologFlags", "PrologEpilogTimeout",
                         "SchedulerParameters", "HealthCheckProgram", "HealthCheckInterval",
                         "HealthCheckNodeState"}
    assert conf["SchedulerParameters"] == "nohold_on_prolog_fail"
    assert conf["Prolog"] == conf["HealthCheckProgram"] == "/etc/slurm/numparity-check.sh"
    assert f"install -m 755 deploy/slurm/numparity-check.sh {conf['Prolog']}" in \
        SCRIPT.read_text()
    assert set(conf["PrologFlags"].split(",")) <= {"Alloc", "Contain", "NoHold", "Serial",
                                                   "X11", "RunInJob", "ForceRequeueOnFail"}
    assert conf["HealthCheckNodeState"] in ("ALLOC", "ANY", "CYCLE", "IDLE", "MIXED",
                                            "NONDRAINED_IDLE")
    budget = int(re.search(r"NUMPARITY_CHECK_SECONDS:-(\d+)", SCRIPT.read_text())[1])
    assert int(conf["PrologEpilogTimeout"]) > budget
    assert int(conf["HealthCheckInterval"]) > 0


def test_the_script_is_valid_shell() -> None:
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    if shutil.which("shellcheck"):
        subprocess.run(["shellcheck", "-s", "bash", str(SCRIPT)], check=True)


@pytest.fixture
def stand_ins(tmp_path: Path) -> dict[str, Any]:
    """An agent that prints a device line and exits with $FAKE_CODE (recording its
    arguments and CUDA_DEVICE_ORDER), and an scontrol that records its arguments."""
    agent = tmp_path / "numparity-agent"
    agent.write_text('#!/bin/bash\necho "$CUDA_DEVICE_ORDER $*" > "$RECORD/agent"\n'
                     'if [ "$FAKE_CODE" = 10 ]; then\n'
                     '  echo "cuda:0 (NVIDIA A100, GPU-aa): go — 2 of 2 answer(s) as pinned"\n'
                     '  echo "cuda:2 (NVIDIA A100, GPU-cc): NO-GO — cnn/strict differs"\n'
                     'fi\n'
                     'echo "check: done" >&2\nexit "$FAKE_CODE"\n')
    scontrol = tmp_path / "scontrol"
    scontrol.write_text('#!/bin/bash\nprintf "%s\\n" "$@" > "$RECORD/scontrol"\n')
    for path in (agent, scontrol):
        path.chmod(0o755)
    record = tmp_path / "record"
    record.mkdir()
    env = {"PATH": os.environ["PATH"], "RECORD": str(record), "NUMPARITY_AGENT": str(agent),
           "NUMPARITY_SCONTROL": str(scontrol), "SLURMD_NODENAME": "gpu-node-17",
           "NUMPARITY_NUMERIC_ENV": str(tmp_path / "none.env")}
    return {"env": env, "record": record}


def run_script(stand_ins: dict[str, Any], code: int, **env: str) -> tuple[int, str, str]:
    done = subprocess.run(["bash", str(SCRIPT)], env={**stand_ins["env"], "FAKE_CODE":
                                                      str(code), **env},
                          capture_output=True, text=True, timeout=60)
    record = stand_ins["record"]
    drained = (record / "scontrol").read_text() if (record / "scontrol").exists() else ""
    return done.returncode, (record / "agent").read_text(), drained


def test_a_go_starts_the_job(stand_ins: dict[str, Any]) -> None:
    code, agent, drained = run_script(stand_ins, 0, SLURM_JOB_ID="42", SLURM_JOB_GPUS="0,2")
    assert code == 0 and drained == ""
    # The job's GPUs, numbered as Slurm numbers them; fail-open unless said otherwise.
    assert agent.split() == ["PCI_BUS_ID", "check", "--config", "/etc/numparity/agent.toml",
                             "--max-seconds", "60", "--fail-open", "--device", "cuda:0,cuda:2"]


def test_a_no_go_drains_the_node_naming_the_gpu_and_requeues(stand_ins: dict[str, Any]) -> None:
    code, _agent, drained = run_script(stand_ins, 10, SLURM_JOB_ID="42", SLURM_JOB_GPUS="0,2")
    assert code == 1
    assert drained.splitlines() == [
        "update", "NodeName=gpu-node-17", "State=DRAIN",
        "Reason=numparity: cuda:2 (NVIDIA A100, GPU-cc): NO-GO — cnn/strict differs"]
    # As the health check: every GPU, the node drained, exit 0 (slurmd ignores it).
    code, agent, drained = run_script(stand_ins, 13)
    assert code == 0 and "--device" not in agent and "State=DRAIN" in drained


def test_the_health_check_ends_before_slurmd_kills_it(stand_ins: dict[str, Any]) -> None:
    """slurmd kills a HealthCheckProgram at 60 s whatever PrologEpilogTimeout says (slurmd
    22.05, `run_script(..., 60, ...)`): killed, it drains nothing. As the health check the
    budget is NUMPARITY_HEALTH_CHECK_SECONDS (45), never over 50, not the prolog's."""
    code, agent, drained = run_script(stand_ins, 13, NUMPARITY_CHECK_SECONDS="240")
    assert code == 0 and "State=DRAIN" in drained
    assert agent.split() == ["PCI_BUS_ID", "check", "--config", "/etc/numparity/agent.toml",
                             "--max-seconds", "45", "--fail-open"]
    for asked, used in (("30", "30"), ("55", "50"), ("soon", "50")):
        code, agent, _drained = run_script(stand_ins, 0,
                                           NUMPARITY_HEALTH_CHECK_SECONDS=asked)
        assert code == 0 and agent.split()[agent.split().index("--max-seconds") + 1] == used
    # The prolog keeps its own budget.
    code, agent, _drained = run_script(stand_ins, 0, SLURM_JOB_ID="42", SLURM_JOB_GPUS="1",
                                       NUMPARITY_CHECK_SECONDS="240",
                                       NUMPARITY_HEALTH_CHECK_SECONDS="30")
    assert agent.split()[agent.split().index("--max-seconds") + 1] == "240"


def test_a_drain_scontrol_refuses_says_why(stand_ins: dict[str, Any],
                                          tmp_path: Path) -> None:
    """slurmd gives a health check no SLURM_CONF (measured under slurmd 22.05): where
    slurm.conf is elsewhere than Slurm's default path, scontrol cannot drain. The log
    says so and names the setting."""
    scontrol = tmp_path / "scontrol-without-conf"
    scontrol.write_text("#!/bin/bash\necho 'scontrol: fatal: Could not establish a "
                        "configuration source' >&2\nexit 1\n")
    scontrol.chmod(0o755)
    done = subprocess.run(["bash", str(SCRIPT)], env={
        **stand_ins["env"], "FAKE_CODE": "13", "NUMPARITY_SCONTROL": str(scontrol)},
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert ("could not drain gpu-node-17: scontrol: fatal: Could not establish a "
            "configuration source") in done.stderr
    assert "SLURM_CONF in /etc/numparity/check.env" in done.stderr


def test_the_job_gpus_at_their_slots_among_cuda_visible_devices(
        stand_ins: dict[str, Any]) -> None:
    """slurmd sets CUDA_VISIBLE_DEVICES to the job's GPUs (tests/deploy/test_slurm_prolog.py
    measures it): Slurm's GPUs 0,2 are then CUDA's cuda:0 and cuda:1."""
    code, agent, drained = run_script(stand_ins, 0, SLURM_JOB_ID="42", SLURM_JOB_GPUS="0,2",
                                      CUDA_VISIBLE_DEVICES="0,2")
    assert code == 0 and drained == ""
    assert agent.split()[-2:] == ["--device", "cuda:0,cuda:1"]
    # The no-go line names cuda:2 of a node showing every GPU; with CUDA_VISIBLE_DEVICES
    # 1,2,3 it is Slurm's GPU 3, and the reason says so.
    code, agent, drained = run_script(stand_ins, 10, SLURM_JOB_ID="42",
                                      SLURM_JOB_GPUS="1,2,3", CUDA_VISIBLE_DEVICES="1,2,3")
    assert code == 1 and agent.split()[-2:] == ["--device", "cuda:0,cuda:1,cuda:2"]
    assert "Reason=numparity: GPU 3: cuda:2 (NVIDIA A100, GPU-cc): NO-GO" in drained
    # UUIDs in CUDA_VISIBLE_DEVICES: the visible GPUs are the job's.
    code, agent, _drained = run_script(stand_ins, 0, SLURM_JOB_ID="42", SLURM_JOB_GPUS="1",
                                       CUDA_VISIBLE_DEVICES="GPU-8f3a")
    assert agent.split()[-2:] == ["--device", "all"]


@pytest.mark.parametrize("code", [2, 5, 11, 12, 14, 126, 127])
def test_fail_open_drains_only_on_a_no_go(stand_ins: dict[str, Any], code: int) -> None:
    done, _agent, drained = run_script(stand_ins, code, SLURM_JOB_ID="42",
                                       SLURM_JOB_GPUS="1")
    assert done == 0 and drained == ""


def test_fail_closed_drains_when_the_check_cannot_tell(stand_ins: dict[str, Any]) -> None:
    code, agent, drained = run_script(stand_ins, 12, SLURM_JOB_ID="42",
                                      NUMPARITY_CHECK_FAIL="closed")
    assert "--fail-closed" in agent.split() and code == 1
    assert "Reason=numparity: check could not tell (exit 12): check: done" in drained


def test_the_script_with_the_real_agent(tmp_path: Path, stand_ins: dict[str, Any]) -> None:
    """The real agent against a server that is not there: fail-open lets the job start,
    fail-closed drains the node."""
    config = tmp_path / "agent.toml"
    config.write_text('server = "http://127.0.0.1:9"\ntoken = "np_unused"\n')
    agent = shutil.which("numparity-agent", path=str(Path(sys.executable).parent))
    assert agent is not None
    env = {**clean_env(), "RECORD": str(stand_ins["record"]), "NUMPARITY_AGENT": agent,
           "NUMPARITY_SCONTROL": stand_ins["env"]["NUMPARITY_SCONTROL"],
           "NUMPARITY_CONFIG": str(config), "SLURM_JOB_ID": "42",
           "NUMPARITY_NUMERIC_ENV": str(ROOT / "deploy" / "numeric.env"),
           "NUMPARITY_CHECK_SECONDS": "30"}
    done = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True,
                          timeout=90)
    assert done.returncode == 0, done.stderr
    assert "go (fail-open)" in done.stderr
    done = subprocess.run(["bash", str(SCRIPT)], env={**env, "NUMPARITY_CHECK_FAIL": "closed"},
                          capture_output=True, text=True, timeout=90)
    assert done.returncode == 1, done.stderr
    assert "could not tell (exit 12)" in (stand_ins["record"] / "scontrol").read_text()
