"""`serve --workers 2` killed with SIGKILL (the OOM killer, `kill -9`): its workers stop
too and the port is free again, where they went on serving, orphaned, and the next
`serve` on the port failed."""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

import httpx
import pytest
from helpers.processes import children, start_server, stop_process, wait_ready

pytestmark = pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)


def port_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def alive(pid: int) -> bool:
    """Running (a zombie waiting for whoever adopted it to reap it is not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_workers_stop_when_serve_is_killed(migrated_database_url, tmp_path: Path):
    if not Path("/proc").is_dir():
        pytest.skip("finds the workers in /proc (Linux)")
    log_path = tmp_path / "server.log"
    env = {**os.environ, "NUMPARITY_DATABASE_URL": migrated_database_url}
    process, base_url = start_server(log_path, env, "--workers", "2", "--log-level", "warning")
    workers: list[int] = []
    try:
        wait_ready(base_url, process, log_path, timeout=150)
        workers = children(process.pid)
        assert len(workers) >= 2, log_path.read_text()
        process.send_signal(signal.SIGKILL)
        process.wait(15)
        port = int(base_url.rsplit(":", 1)[1])
        deadline = time.monotonic() + 30
        while any(alive(pid) for pid in workers) or not port_free(port):
            assert time.monotonic() < deadline, (
                f"workers {workers} still running or port {port} taken 30 s after SIGKILL")
            time.sleep(0.1)
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{base_url}/healthz", timeout=2)
    finally:
        stop_process(process)
        for pid in filter(alive, workers):  # only when the test failed
            os.kill(pid, signal.SIGKILL)
