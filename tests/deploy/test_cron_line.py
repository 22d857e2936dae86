"""The cron line the README, the lab page and the fleet page give, run as cron runs it:
`/bin/sh -c` with cron's environment only (`env -i`, PATH=/usr/bin:/bin, HOME, LOGNAME,
SHELL), no terminal. The paths of a node are this checkout's: /opt/ml/bin/numparity-agent
is this Python's agent, /etc/numparity and /var/log are folders of the test, --jitter 0.
The server is not there, so a run is kept in the spool (exit 3): what cron shows is the
log, which must say so. Before, the README's line failed with `numparity-agent: not
found` and left nothing anywhere.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = ("README.md", "docs/getting-started/lab.md", "docs/how-to/agent-fleet.md")
CRON_ENV_PATH = "/usr/bin:/bin"


def cron_lines() -> dict[str, str]:
    """Each page's /etc/cron.d line: the command after the five times and the user."""
    found = {}
    for page in PAGES:
        (line,) = [line for line in (ROOT / page).read_text().splitlines()
                   if line.startswith("0 * * * *")]
        fields = line.split(None, 6)
        assert fields[5] == "root", line
        found[page] = fields[6]
    return found


def test_the_pages_give_one_cron_line() -> None:
    assert len(set(cron_lines().values())) == 1


def test_the_cron_line_runs_under_crons_environment(tmp_path: Path) -> None:
    (command,) = set(cron_lines().values())
    agent = shutil.which("numparity-agent", path=str(Path(sys.executable).parent))
    assert agent is not None
    etc, log = tmp_path / "etc", tmp_path / "log"
    etc.mkdir()
    log.mkdir()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}"
    (etc / "agent.token").write_text("np_unused\n")
    (etc / "agent.token").chmod(0o600)
    (etc / "agent.toml").write_text(f'server = "{closed}"\n'
                                    f'token_file = "{etc / "agent.token"}"\n'
                                    f'spool = "{tmp_path / "spool"}"\n')
    # The node's numeric settings, and (for a short run) the suite narrowed the way a
    # lab could narrow it in that file.
    (etc / "numeric.env").write_text(
        (ROOT / "deploy" / "numeric.env").read_text()
        + "NUMPARITY_WORKLOADS=mlp\nNUMPARITY_VARIANTS=default\nNUMPARITY_REPEATS=1\n"
          "NUMPARITY_DEVICE=cpu\n")
    here = (command.replace("/opt/ml/bin/numparity-agent", agent)
            .replace("/etc/numparity/", f"{etc}/").replace("/var/log/", f"{log}/")
            .replace("--jitter 900", "--jitter 0"))
    assert here != command and "/opt/ml" not in here and "/etc/numparity" not in here
    done = subprocess.run(
        ["/usr/bin/env", "-i", f"PATH={CRON_ENV_PATH}", f"HOME={tmp_path}",
         "LOGNAME=root", "SHELL=/bin/sh", "/bin/sh", "-c", here],
        capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    written = (log / "numparity-agent.log").read_text()
    assert done.returncode == 3, done.stderr + written
    assert done.stdout == done.stderr == ""  # everything went to the log
    assert "exit 3: kept in the spool for the next run" in written
    assert len(list((tmp_path / "spool").glob("*.json"))) == 1


def test_the_delay_is_added_once(tmp_path: Path) -> None:
    """The fleet page's agent.toml (read by cron's runs, systemd's and `check`) has no
    jitter: cron's line adds --jitter, systemd's timer RandomizedDelaySec, and
    `systemctl start numparity-agent  # one run now` starts at once."""
    from numparity_agent import _config

    page = (ROOT / "docs" / "how-to" / "agent-fleet.md").read_text()
    toml = page.split("```toml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "agent.toml"
    path.write_text(toml)
    assert _config.load_config(path).get("jitter") is None
    (command,) = set(cron_lines().values())
    assert "--jitter 900" in command
    timer = (ROOT / "deploy" / "systemd" / "numparity-agent.timer").read_text()
    service = (ROOT / "deploy" / "systemd" / "numparity-agent.service").read_text()
    assert "RandomizedDelaySec=15min" in timer
    assert "--jitter" not in service and "--config /etc/numparity/agent.toml" in service
