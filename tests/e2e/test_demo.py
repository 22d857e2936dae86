"""`numparity-server demo` stopped while its fleet runs: SIGTERM (a service manager, `kill`)
and SIGINT (Ctrl-C) alike end the agents and the server and remove the temporary folder.

The report itself, and a stop while serving, are checked by the README's quick start
(``test_quick_start.py``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers.processes import Output, children, server_command, wait_group_gone


def agent_processes(pid: int) -> list[int]:
    found = []
    for child in children(pid):
        try:
            command = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if b"numparity_agent" in command:
            found.append(child)
    return found


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_a_stop_while_the_fleet_runs_leaves_nothing_behind(sig: signal.Signals) -> None:
    process = subprocess.Popen(
        [*server_command(), "demo"], text=True, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, start_new_session=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("NUMPARITY_")},
    )  # fmt: skip
    output = Output(process.stdout)
    try:
        database = output.wait_for(r"database sqlite:///(\S+)/numparity\.db", 120)
        workdir = Path(database.group(1))
        deadline = time.monotonic() + 120
        while not (agents := agent_processes(process.pid)):
            assert process.poll() is None and time.monotonic() < deadline, output.text()
            time.sleep(0.1)
        # The signal goes to the demo's process group, as a terminal sends Ctrl-C; the
        # agents run in groups of their own, so the demo must end them itself.
        os.killpg(process.pid, sig)
        process.wait(timeout=120)
        output.close()
        assert process.returncode == 128 + sig, output.text()
        assert "stopped before the report" in output.text()
        assert not workdir.exists(), f"{workdir} was left behind: {list(workdir.rglob('*'))}"
        for agent in agents:  # each agent's group: the agent and its variant children
            with pytest.raises(ProcessLookupError):
                os.killpg(agent, 0)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        wait_group_gone(process.pid)
