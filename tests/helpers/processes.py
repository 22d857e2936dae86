"""Real ``numparity-server`` processes for tests: the command, a free loopback port, the
CLI, waiting until a server is ready, stopping it. Importable from every test folder
(pytest puts ``tests/`` on the path for its conftest)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx


def free_port() -> int:
    """A free loopback port (the server's own helper, imported only when asked for: the
    agent's tests import this module where the server is not installed)."""
    from numparity_server.kit.net import free_port as server_free_port

    return server_free_port()


def server_command() -> list[str]:
    """The installed ``numparity-server`` script (next to this Python), else ``-m``."""
    script = Path(sys.executable).with_name("numparity-server")
    if script.exists():
        return [str(script)]
    found = shutil.which("numparity-server")
    return [found] if found else [sys.executable, "-m", "numparity_server.cli"]


def run_cli(*args: str, database_url: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``numparity-server ARGS`` against ``database_url``; fails the test on error."""
    env = {**os.environ, "NUMPARITY_DATABASE_URL": database_url}
    done = subprocess.run([*server_command(), *args], env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, f"numparity-server {' '.join(args)} failed:\n{done.stderr}"
    return done



# How long a process may take to answer: generous, since a loaded 2-core machine (two
# test workers, each starting servers and agents) can take a minute to import a server;
# a process that exits fails at once.
READY_TIMEOUT = 300


def wait_ready(base_url: str, process: subprocess.Popen | ForkedServer, log_path: Path, *,
               timeout: float = READY_TIMEOUT, path: str = "/readyz",
               name: str = "numparity-server") -> None:
    """Until ``path`` answers 200; raises with the process's log if it exits or never
    gets there (``name`` says which process in the message)."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with {process.returncode}:\n{_log(log_path)}")
        try:
            response = httpx.get(f"{base_url}{path}", timeout=2)
            if response.status_code == 200:
                return
            last = f"{response.status_code} {response.text}"
        except httpx.TransportError as exc:
            last = repr(exc)
        time.sleep(0.1)
    raise RuntimeError(f"{name} not ready after {timeout}s ({last}):\n{_log(log_path)}")


def stop_process(process: subprocess.Popen | ForkedServer, timeout: float = 15) -> None:
    """SIGTERM (a server's graceful shutdown), then SIGKILL if it does not go."""
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=timeout)


def _log(log_path: Path) -> str:
    return log_path.read_text(errors="replace") if log_path.exists() else ""


class _Zygote:
    """This test process's helpers/server_zygote.py: started when first asked for, gone
    with the process (its stdin closes)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None
        self._broken = False

    def _ask(self, request: dict) -> dict:
        assert self._process is not None and self._process.stdin and self._process.stdout
        self._process.stdin.write(json.dumps(request) + "\n")
        self._process.stdin.flush()
        answer = self._process.stdout.readline()
        if not answer:
            raise RuntimeError(f"the server zygote exited with {self._process.wait()}")
        return json.loads(answer)

    def spawn(self, argv: list[str], env: dict[str, str], log_path: Path) -> ForkedServer | None:
        """A forked ``numparity-server ARGV``; None where the zygote cannot start here."""
        with self._lock:
            if self._broken:
                return None
            if self._process is None or self._process.poll() is not None:
                # Nothing a test set for one server is imported into all of them.
                own = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
                self._process = subprocess.Popen(
                    [sys.executable, str(Path(__file__).with_name("server_zygote.py"))],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=own,
                )  # fmt: skip
                assert self._process.stdout is not None
                if not self._process.stdout.readline():  # the server's packages are missing
                    self._broken = True
                    return None
            pid = self._ask({"spawn": {"argv": argv, "env": env, "log": str(log_path)}})["pid"]
            return ForkedServer(self, pid, argv)

    def returncode(self, pid: int) -> int | None:
        with self._lock:
            code: int | None = self._ask({"poll": pid})["returncode"]
            return code


_ZYGOTE = _Zygote()


class ForkedServer:
    """A forked server as ``subprocess.Popen`` shows a process: pid, poll, wait, signals."""

    def __init__(self, zygote: _Zygote, pid: int, argv: list[str]) -> None:
        self._zygote = zygote
        self.pid = pid
        self.args = argv
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._zygote.returncode(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            time.sleep(0.02)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, number: int) -> None:
        if self.poll() is None:  # reaped means gone: never signal a pid that may be reused
            os.kill(self.pid, number)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def start_server(log_path: Path, env: dict[str, str], *args: str
                 ) -> tuple[subprocess.Popen | ForkedServer, str]:
    """``numparity-server serve ARGS`` on a free loopback port, its output in
    ``log_path``; returns the process and its base URL (not yet ready: ``wait_ready``).

    Forked from this process's server zygote (helpers/server_zygote.py: the server
    imported once) unless what it runs is read at import: several workers, or
    prometheus_client's multiprocess folder. ``NUMPARITY_TEST_FORK_SERVERS=0`` starts
    every one as its own process."""
    port = free_port()
    argv = ["serve", "--host", "127.0.0.1", "--port", str(port), *args]
    if (os.environ.get("NUMPARITY_TEST_FORK_SERVERS", "1") != "0"
            and "--workers" not in args and "PROMETHEUS_MULTIPROC_DIR" not in env):
        forked = _ZYGOTE.spawn(argv, env, log_path)
        if forked is not None:
            return forked, f"http://127.0.0.1:{port}"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [*server_command(), *argv],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )
    return process, f"http://127.0.0.1:{port}"


class Output:
    """A process's output, read as it comes (so the pipe never fills)."""

    def __init__(self, stream: object) -> None:
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: object) -> None:
        for line in stream:  # type: ignore[attr-defined]
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self.lines.append("\0EOF")
            self._changed.notify_all()

    def wait_for(self, pattern: str, timeout: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        regex = re.compile(pattern)
        with self._changed:
            while True:
                for line in self.lines:
                    if match := regex.search(line):
                        return match
                left = deadline - time.monotonic()
                if left <= 0 or (self.lines and self.lines[-1] == "\0EOF"):
                    raise AssertionError(f"no line matching {pattern!r} in the output:\n"
                                         + self.text())
                self._changed.wait(left)

    def text(self) -> str:
        return "\n".join(line for line in self.lines if line != "\0EOF")

    def close(self, timeout: float = 30) -> None:
        self._thread.join(timeout)


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux: /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            # "pid (comm) state ppid …"; comm may hold spaces and parentheses.
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                found.append(int(stat.parent.name))
    return found


def wait_group_gone(pgid: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    raise AssertionError(f"processes of group {pgid} were still there after {timeout} s")
