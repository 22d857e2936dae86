"""A real single-node Slurm for tests: Debian's slurm-wlm daemons (slurmctld, slurmd) and
munge, on loopback, in a folder of their own, with fake GPUs as gres.

The GPUs are character devices made with mknod in that folder (NVIDIA's major 195, as
/dev/nvidiaN): slurmd only looks at the files, and gives each job's prolog
SLURM_JOB_GPUS and CUDA_VISIBLE_DEVICES as it would on a GPU node. What computes on them
is the agent's fake CUDA (tests/helpers/fake_cuda).

Slurm runs where its packages are installed and the tests run as root (slurmd runs jobs
and prologs as root; munged and the daemons' files are checked for ownership). Elsewhere
the tests skip, saying why, unless NUMPARITY_SLURM_TESTS=required (.ci/run sets it after
installing the packages): then a missing Slurm fails them.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REQUIRED_ENV = "NUMPARITY_SLURM_TESTS"
INSTALL = "apt-get install slurmd slurmctld slurm-client munge"
PROGRAMS = ("munged", "slurmctld", "slurmd", "srun", "sbatch", "scontrol", "squeue", "scancel",
            "sinfo")
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def unavailable() -> str | None:
    """Why no Slurm can be started here, or None."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "a real slurmd runs its prologs as root: these tests need root"
    missing = [name for name in PROGRAMS if not shutil.which(name, path=SYSTEM_PATH)]
    if missing:
        return f"{', '.join(missing)} not installed ({INSTALL})"
    return None


def require_slurm() -> None:
    """Skip (or, where NUMPARITY_SLURM_TESTS=required, fail) where Slurm cannot run."""
    reason = unavailable()
    if reason is None:
        return
    if os.environ.get(REQUIRED_ENV) == "required":
        pytest.fail(f"{REQUIRED_ENV}=required but {reason}")
    pytest.skip(reason)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait(what: str, ready: object, timeout: float, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():  # type: ignore[operator]
            return
        time.sleep(0.1)
    tail = log.read_text(errors="replace")[-3000:] if log and log.exists() else ""
    raise AssertionError(f"{what} not within {timeout} s\n{tail}")


@dataclass
class Slurm:
    """A running cluster of one node."""

    root: Path
    munge: Path
    conf: Path
    node: str
    gpus: int
    daemons: list[subprocess.Popen] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *command: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(command), env=self.env(), capture_output=True, text=True,
                              timeout=timeout, check=False)

    def show(self, kind: str, name: str) -> str:
        """`scontrol show KIND NAME` on one line."""
        done = self.run("scontrol", "-o", "show", kind, name)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    def node_state(self) -> tuple[str, str]:
        """(State, Reason) of the node; Reason '' when there is none."""
        line = self.show("node", self.node)
        state = re.search(r"\bState=(\S+)", line)
        reason = re.search(r"\bReason=(.*?)(?: \[[^\]]*\])?(?: \w+=|$)", line)
        return (state[1] if state else "", reason[1] if reason else "")

    def job(self, job_id: str) -> dict[str, str]:
        """A job's fields (`scontrol show job`), the values without spaces."""
        return dict(re.findall(r"(\w+)=(\S*)", self.show("job", job_id)))

    def wait_job(self, job_id: str, done: object, timeout: float = 90) -> dict[str, str]:
        """Poll the job until `done(fields)` is true; its fields then."""
        found: dict[str, str] = {}

        def ready() -> bool:
            nonlocal found
            found = self.job(job_id)
            return bool(done(found))  # type: ignore[operator]

        _wait(f"job {job_id} to reach the state asked for ({found})", ready, timeout,
              self.root / "slurmctld.log")
        return found

    def resume(self) -> None:
        done = self.run("scontrol", "update", f"NodeName={self.node}", "State=RESUME")
        assert done.returncode == 0, done.stderr
        _wait("the node to be idle again", lambda: "DRAIN" not in self.node_state()[0], 30)

    def stop(self) -> None:
        """Cancel every job, wait for them to end, stop the daemons (munge last)."""
        with contextlib.suppress(Exception):
            self.run("scancel", "--full", "--user", "root", timeout=30)
            _wait("the jobs to end", lambda: not self.run(
                "squeue", "-h", "-o", "%i", timeout=30).stdout.strip(), 30)
        for process in reversed(self.daemons):
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=15)
        shutil.rmtree(self.munge, ignore_errors=True)


def node_name() -> str:
    """A node name of its own (two clusters may run side by side on one machine)."""
    return f"np{secrets.token_hex(3)}"


def start_slurm(root: Path, *, node: str, gpus: int, conf_lines: str, cpus: int = 8) -> Slurm:
    """slurmctld + slurmd (+ munged) on loopback with `gpus` fake GPUs and `conf_lines`
    added to slurm.conf. The state and spool are new folders under `root` (fresh on each
    start); the caller stops it (Slurm.stop)."""
    root.mkdir(parents=True, exist_ok=True)
    host = socket.gethostname().split(".")[0]
    # munged refuses a socket folder that others may write, a key others may read, and a
    # socket whose every parent folder others may not enter: pytest's folders are 0700,
    # so the socket's folder is a new one in the system's temporary folder.
    munge = Path(tempfile.mkdtemp(prefix="numparity-munge-"))
    munge.chmod(0o755)
    key = munge / "munge.key"
    key.write_bytes(secrets.token_bytes(1024))
    key.chmod(0o400)
    socket_path = munge / "munge.socket.2"
    devices = root / "dev"
    devices.mkdir()
    for index in range(gpus):
        os.mknod(devices / f"nvidia{index}", 0o600 | 0o020000, os.makedev(195, index))
    for folder in ("state", "spool"):
        (root / folder).mkdir()
    conf = root / "slurm.conf"
    conf.write_text(f"""\
ClusterName=numparity
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={socket_path}
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root / 'state'}
SlurmdSpoolDir={root / 'spool'}
SlurmctldPidFile={root / 'slurmctld.pid'}
SlurmdPidFile={root / 'slurmd.pid'}
SlurmctldLogFile={root / 'slurmctld.log'}
SlurmdLogFile={root / 'slurmd.log'}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MailProg=/bin/true
ReturnToService=2
SlurmdParameters=config_overrides
GresTypes=gpu
{conf_lines}
NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 CPUs={cpus} Gres=gpu:{gpus} State=UNKNOWN
PartitionName=numparity Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
    files = f"nvidia[0-{gpus - 1}]" if gpus > 1 else "nvidia0"
    (root / "gres.conf").write_text(f"NodeName={node} Name=gpu File={devices}/{files}\n")
    cluster = Slurm(root=root, munge=munge, conf=conf, node=node, gpus=gpus)
    env = cluster.env()
    try:
        with (root / "munged.out").open("wb") as out:
            cluster.daemons.append(subprocess.Popen(
                ["munged", "-F", f"--socket={socket_path}", f"--key-file={key}",
                 f"--log-file={munge / 'munged.log'}", f"--pid-file={munge / 'munged.pid'}",
                 f"--seed-file={munge / 'munged.seed'}"], stdout=out, stderr=out, env=env,
                cwd=root))
        _wait("munged's socket", socket_path.exists, 20, root / "munged.out")
        for command in (["slurmctld", "-D", "-i", "-f", str(conf)],
                        ["slurmd", "-D", "-N", node, "-f", str(conf)]):
            name = command[0]
            with (root / f"{name}.out").open("wb") as out:
                # Their folder is the prologs' (a crashing GPU's core dump lands there).
                cluster.daemons.append(subprocess.Popen(command, stdout=out, stderr=out,
                                                        env=env, cwd=root))
        _wait("the node to be idle", lambda: cluster.run(
            "sinfo", "-h", "-n", node, "-o", "%T", timeout=30).stdout.strip() == "idle",
            60, root / "slurmd.log")
    except BaseException:
        cluster.stop()
        raise
    return cluster
