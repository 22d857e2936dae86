"""A fork server for the variant children (design §2.3): one interpreter imports torch
and the agent once, then forks a process for each child the run asks for, which starts
without importing torch again (a child's import was most of a variant's overhead: 3 to
4 s of a GPU node's, more on a loaded CPU).

    python -m numparity_agent._forkserver SOCKET

The server imports PRELOAD, checks that no thread started (but OpenBLAS's, which is
fork-safe) and that CUDA is not initialised, prints one JSON line `{"ready": true, ...}`
and serves SOCKET, a Unix socket; it ends when its stdin closes (the agent ended or
closed it). Each connection is one child: a JSON line {"module", "argv", "env", "cwd",
"stdout", "stderr"} is answered with {"pid": N} as soon as the child runs and
{"returncode": N} when it has ended (negative: the signal that ended it, as subprocess
says). The child is forked from a supervisor forked per connection, which waits for it,
so the server itself never waits.

What makes a forked child the same as a fresh interpreter:
- CUDA is never initialised in the server (nothing in PRELOAD touches a device, and the
  server refuses to serve if it finds CUDA initialised), so each child initialises its
  own, as a fresh process does; a forked CUDA context would be unusable anyway.
- The server has one thread when it forks, but for OpenBLAS's pool, which stops itself
  around a fork (it refuses to serve if any other started): OpenMP's and ATen's thread
  pools start in the child, on its first parallel op, with the child's settings.
- The child's environment is replaced by the one asked for before its module runs, and
  its module runs afresh (`runpy`, as `python -m`). What a variant changes in the
  environment must be read after that moment: SET_AFTER_FORK lists the variables that
  may differ from the server's own environment, each with where it is read; a child
  whose environment differs in any other variable gets a fresh interpreter
  (`ForkServer.refuses`).
- Its generators are reseeded as a fresh interpreter seeds them (`_become_child`).
What stays the server's: str's hash seed (the iteration order of a set of strings), the
same in every child; nothing numeric depends on it.
This module does not import torch in the agent's own process.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import random
import runpy
import select
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings
from typing import Any

# What a child imports before its first line of work: torch and the agent's modules the
# variant child (`_child.run_child`) and the environment child use.
PRELOAD = (
    "numpy",
    "torch",
    "numparity_agent._child",
    "numparity_agent._runner",
    "numparity_agent._trace",
    "numparity_agent._environment",
    "numparity_agent._devices",
    "numparity_agent._values",
    "numparity_agent._cli",
)

# The environment variables a forked child may have other than the server's, each with
# where it is read: after CUDA's initialisation, which the server never reaches. Any
# other difference (a variable read when torch, OpenMP or MKL load) needs a fresh
# interpreter.
SET_AFTER_FORK: dict[str, str] = {
    "CUDA_VISIBLE_DEVICES": (
        "read by the CUDA driver in cuInit, and by torch.cuda's device count when it is "
        "first asked (torch/cuda/__init__.py, _parse_visible_devices); the server asks "
        "neither"),
    "CUBLAS_WORKSPACE_CONFIG": (
        "read with getenv by ATen when it sizes a cuBLAS handle's workspace "
        "(CublasHandlePool.cpp, getChosenWorkspaceSize, on the first cuBLAS call) and "
        "when deterministic algorithms check it (Context::checkCuBLASConfigDeterministic, "
        "on each such call), and by cuBLAS when a handle is created; all after CUDA "
        "initialises"),
}

READY_TIMEOUT_S = 600.0
_LINE_LIMIT = 1 << 20


class _Lines:
    """The lines of a connection, each read whole: a wait that times out keeps what it
    had read for the next one (a line is never cut, whatever the load)."""

    def __init__(self, conn: socket.socket) -> None:
        self._conn = conn
        self._buffer = b""

    def read(self, deadline: float | None = None) -> bytes | None:
        """The next line (without its newline); None at the end of the stream. Raises
        TimeoutError past `deadline` (time.monotonic)."""
        while b"\n" not in self._buffer:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError
            ready, _w, _x = select.select([self._conn], [], [], left)
            if not ready:
                raise TimeoutError
            try:
                chunk = self._conn.recv(4096)
            except OSError:
                return None
            if not chunk or len(self._buffer) > _LINE_LIMIT:
                return None
            self._buffer += chunk
        line, _newline, self._buffer = self._buffer.partition(b"\n")
        return line


# The server side ----------------------------------------------------------------------

def _threads() -> int:
    """This process's threads (the kernel's count: C libraries' threads too)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def serve(socket_path: str) -> int:
    started = time.monotonic()
    alone = _threads()
    # numpy's OpenBLAS starts its thread pool as it loads; it stops the pool itself
    # before a fork and starts it again on first use (pthread_atfork, OpenBLAS's
    # memory.c, openblas_fork_handler), so those threads are safe. No other may start.
    importlib.import_module("numpy")
    blas = _threads() - alone
    import torch

    # torch's CPU generator as a fresh interpreter has it: seeded from the system's
    # entropy (each child reseeds it) or, in a torch that seeds it with its fixed default,
    # that state (each child starts from it, whatever the agent's imports drew).
    fresh_rng = (None if torch.initial_seed() != torch.Generator().initial_seed()
                 else torch.get_rng_state())
    for name in PRELOAD:
        importlib.import_module(name)

    threads = _threads() - blas
    refusal = None
    if torch.cuda.is_initialized():
        refusal = "CUDA was initialised while importing the agent"
    elif threads != 1 or threading.active_count() != 1:
        refusal = (f"{threads - 1} thread(s) besides OpenBLAS's started while importing "
                   "torch and the agent; forking is unsafe")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    if refusal is None:
        listener.bind(socket_path)  # before the agent is told: it connects at once
        listener.listen(64)
    print(json.dumps({"ready": refusal is None, "refusal": refusal, "threads": threads,
                      "blas_threads": blas, "import_s": round(time.monotonic() - started, 3)}),
          flush=True)
    if refusal is not None:
        return 3
    # Supervisors are reaped by the kernel: the server never waits for a process.
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(sys.stdin.fileno(), selectors.EVENT_READ)
    while True:
        for key, _events in selector.select():
            if key.fileobj != listener:
                if not os.read(sys.stdin.fileno(), 4096):
                    return 0  # the agent closed our stdin, or ended
                continue
            conn, _address = listener.accept()
            if os.fork() == 0:
                selector.close()
                listener.close()
                _supervise(conn, fresh_rng)
            conn.close()


def _supervise(conn: socket.socket, fresh_rng: Any) -> None:
    """The supervisor of one child: fork it, say its pid, wait, say how it ended."""
    code = 0
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        line = _Lines(conn).read()
        if line is None:
            return
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _become_child(request, conn, fresh_rng)
        conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        _pid, status = os.waitpid(pid, 0)
        returncode = os.waitstatus_to_exitcode(status)
        conn.sendall(json.dumps({"returncode": returncode}).encode() + b"\n")
    except BaseException:  # noqa: BLE001 - the agent sees the connection end
        code = 1
    finally:
        os._exit(code)


def _become_child(request: dict[str, Any], conn: socket.socket, fresh_rng: Any) -> None:
    """Run `request`'s module as `python -m` would, in this freshly forked process."""
    code: int = 1
    try:
        conn.close()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        # The generators as in a fresh interpreter (`serve`), never the server's state
        # shared by every child: Python's and numpy's global ones from the system's
        # entropy; CUDA's are created, seeded as ever, when the child initialises CUDA.
        import numpy
        import torch

        if fresh_rng is None:
            torch.default_generator.seed()
        else:
            torch.set_rng_state(fresh_rng)
        random.seed()
        numpy.random.seed()
        # Before anything else runs: the child's environment, whole (putenv too, so
        # that C code's getenv reads it).
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        for fd, path, flags in ((0, os.devnull, os.O_RDONLY),
                                (1, request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                                (2, request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
            opened = os.open(path, flags, 0o600)
            os.dup2(opened, fd)
            os.close(opened)
        sys.argv = [request["module"], *request["argv"]]
        # runpy's note that the module is imported already (it is: the server preloaded
        # it; `python -m` runs a second copy as __main__ all the same).
        warnings.filterwarnings("ignore", message=".*found in sys.modules after import",
                                category=RuntimeWarning)
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - as an interpreter would, on stderr
        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m numparity_agent._forkserver SOCKET", file=sys.stderr)
        return 2
    return serve(args[0])


# The agent's side ---------------------------------------------------------------------

class ForkedChild:
    """A child the server forked: wait for it, kill it."""

    def __init__(self, conn: socket.socket, lines: _Lines, pid: int) -> None:
        self._conn = conn
        self._lines = lines
        self.pid = pid
        self.returncode: int | None = None

    def wait(self, timeout: float | None = None) -> int | None:
        """Its exit code (negative: a signal), or None if it still runs after `timeout`."""
        if self.returncode is not None:
            return self.returncode
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            line = self._lines.read(deadline)
        except TimeoutError:
            return None
        if line is None:  # the supervisor is gone: the child cannot be told apart
            self.returncode = -signal.SIGKILL
        else:
            self.returncode = int(json.loads(line)["returncode"])
        self._conn.close()
        return self.returncode

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(self.pid, signal.SIGKILL)


class ForkServer:
    """The agent's handle on one fork server, started with `environ` (default: the
    agent's). Thread-safe: the devices' threads ask it for children at once."""

    def __init__(self, environ: dict[str, str] | None = None,
                 ready_timeout: float = READY_TIMEOUT_S) -> None:
        self.environ = dict(os.environ if environ is None else environ)
        self._dir = tempfile.mkdtemp(prefix="numparity-forkserver-")
        self._socket = os.path.join(self._dir, "socket")
        self._stderr = os.path.join(self._dir, "stderr")
        self._ready_timeout = ready_timeout
        self._lock = threading.Lock()
        self._ready: bool | None = None
        self.failure: str | None = None
        # Why children ran in a fresh interpreter instead, each once, in order.
        self.refusals: list[str] = []
        self.import_s: float | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        if not sys.platform.startswith("linux"):
            # Forking a process that loaded torch is Linux's way (macOS's frameworks
            # forbid it after their initialisation): fresh interpreters elsewhere.
            self._ready, self.failure = False, "the fork server runs on Linux only"
            return
        with open(self._stderr, "wb") as err:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "numparity_agent._forkserver", self._socket],
                env=self.environ, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=err)

    def _wait_ready(self) -> bool:
        with self._lock:
            if self._ready is None:
                self._ready = self._read_ready()
            return self._ready

    def _read_ready(self) -> bool:
        assert self._proc is not None and self._proc.stdout is not None
        selector = selectors.DefaultSelector()
        selector.register(self._proc.stdout, selectors.EVENT_READ)
        line = b""
        if selector.select(self._ready_timeout):
            line = self._proc.stdout.readline()
        selector.close()
        try:
            said = json.loads(line)
        except ValueError:
            said = {}
        if said.get("ready"):
            self.import_s = said.get("import_s")
            return True
        self.failure = said.get("refusal") or self._why_gone()
        self.close()
        return False

    def _why_gone(self) -> str:
        code = self._proc.poll() if self._proc is not None else None
        try:
            with open(self._stderr, encoding="utf-8", errors="replace") as f:
                tail = f.read()[-2000:].strip()
        except OSError:
            tail = ""
        what = (f"did not start in {self._ready_timeout:g} s" if code is None
                else f"exited with code {code}")
        return f"the fork server {what}" + (f": {tail}" if tail else "")

    def refuses(self, env: dict[str, str]) -> str | None:
        """Why a child with environment `env` needs a fresh interpreter (None: the
        server forks it): a variable other than SET_AFTER_FORK's differs from the
        server's, or the server could not start."""
        differ = sorted(k for k in set(env) | set(self.environ)
                        if env.get(k) != self.environ.get(k) and k not in SET_AFTER_FORK)
        if differ:
            return f"its environment differs in {', '.join(differ)}"
        if not self._wait_ready():
            return self.failure or "the fork server is not running"
        return None

    def refused(self, reason: str) -> None:
        """Note that a child ran in a fresh interpreter, and why."""
        with self._lock:
            if reason not in self.refusals:
                self.refusals.append(reason)

    def spawn(self, module: str, argv: list[str], *, env: dict[str, str], stdout: str,
              stderr: str, cwd: str | None = None) -> ForkedChild:
        """`python -m module argv...` forked from the server (OSError if it is gone)."""
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(self._socket)
            request = {"module": module, "argv": argv, "env": env, "cwd": cwd or os.getcwd(),
                       "stdout": stdout, "stderr": stderr}
            conn.sendall(json.dumps(request).encode() + b"\n")
            lines = _Lines(conn)
            line = lines.read(time.monotonic() + 60.0)
        except (OSError, TimeoutError) as exc:
            conn.close()
            raise OSError(f"the fork server did not answer: {exc}") from None
        if line is None:
            conn.close()
            raise OSError("the fork server closed the connection")
        return ForkedChild(conn, lines, int(json.loads(line)["pid"]))

    def close(self) -> None:
        """End the server at once, even while it imports (its children, which it does
        not wait for, run on until they end)."""
        if self._proc is None:
            with contextlib.suppress(OSError):
                os.rmdir(self._dir)
            return
        if self._proc.stdin is not None:
            with contextlib.suppress(OSError):
                self._proc.stdin.close()
        try:
            self._proc.wait(timeout=0.5 if self._ready else 0)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()
        for path in (self._socket, self._stderr):
            with contextlib.suppress(OSError):
                os.unlink(path)
        with contextlib.suppress(OSError):
            os.rmdir(self._dir)

    def __enter__(self) -> ForkServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


if __name__ == "__main__":
    sys.exit(main())
