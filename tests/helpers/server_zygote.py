"""A process that imports the server once and forks each ``numparity-server serve`` a test
asks for, so a test's live server starts without importing FastAPI, SQLAlchemy, pydantic
and the server again (about 1.7 CPU-seconds each time, over a minute on a loaded 2-core
machine, for the ~300 live servers of the suite).

It is the server's own CLI that runs in the fork (``numparity_server.cli.main(["serve",
...])``) with the environment and the log the test gave, as the console script would run
it: a fork's settings come from that environment when ``serve`` reads them, never from
the import. What is read at import is not forked: ``serve --workers N`` (uvicorn spawns
fresh interpreters) and prometheus_client's multiprocess folder start a real process
(helpers/processes.py decides).

The protocol is one JSON line each way on the zygote's stdin and stdout:
``{"spawn": {"argv": [...], "env": {...}, "log": path}}`` answers ``{"pid": N}``;
``{"poll": N}`` answers ``{"returncode": code or null}`` (a signal's is minus its number,
as ``subprocess`` says). The zygote reaps its forks; at the end of its stdin it stops the
ones still running.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import traceback
from typing import Any


def _serve(request: dict[str, Any]) -> None:
    """In the fork: become ``numparity-server ARGV`` with the request's environment and log."""
    code = 1
    try:
        for number in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
            signal.signal(number, signal.SIG_DFL)
        os.setpgid(0, 0)  # the zygote's stops reach a server's whole group, as Popen's would
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(null)
        os.environ.clear()
        os.environ.update(request["env"])
        from numparity_server.cli import main

        try:
            code = main(request["argv"]) or 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - the fork must never return into the zygote
        traceback.print_exc()
    finally:
        with open(os.devnull, "w") as sink:  # noqa: PTH123
            sys.stdout, sys.stderr = sink, sink
        os._exit(code)


def main() -> None:
    # What `serve` needs, imported once here; each fork starts from it.
    import uvicorn  # noqa: F401

    import numparity_server.app  # noqa: F401
    import numparity_server.cli  # noqa: F401

    answers = sys.stdout
    codes: dict[int, int] = {}
    running: set[int] = set()

    def reap() -> None:
        while running:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                return
            running.discard(pid)
            codes[pid] = os.waitstatus_to_exitcode(status)

    answers.write(json.dumps({"ready": os.getpid()}) + "\n")
    answers.flush()
    for line in sys.stdin:
        request = json.loads(line)
        reap()
        if "spawn" in request:
            pid = os.fork()
            if pid == 0:
                _serve(request["spawn"])
            running.add(pid)
            answer: dict[str, Any] = {"pid": pid}
        else:
            answer = {"returncode": codes.get(request["poll"])}
        answers.write(json.dumps(answer) + "\n")
        answers.flush()
    for pid in running:  # the test process is gone: so are its servers
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


if __name__ == "__main__":
    main()
