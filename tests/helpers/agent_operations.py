"""What the agent-operations tests share (no tests here): a scripted loopback HTTP server,
run documents, a sleep that does not sleep, the agent as a subprocess."""

from __future__ import annotations

import builtins
import copy
import errno
import gzip
import json
import os
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from helpers.agent import clean_env
from numparity_agent._environment import compute_env_key
from numparity_agent.testing import MISSING_PATH, RUNS_PATH

AGENT = str(Path(sys.executable).with_name("numparity-agent"))
TIMESTAMPED = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ numparity-agent: "


@dataclass
class Answer:
    status: int
    body: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class ScriptedServer:
    """Answers POST /api/v1/runs with the scripted answers in turn (the last one for
    ever after) and every /fingerprints/missing with "all missing". Stands in for a
    server that is down, throttles or refuses: the edge the agent must cope with."""

    url: str
    answers: list[Answer]
    requests: list[tuple[str, dict[str, str], bytes]] = field(default_factory=list)

    def runs(self) -> list[dict[str, Any]]:
        """The run documents POSTed, in order."""
        return [json.loads(gzip.decompress(body)) for path, _h, body in self.requests
                if path == RUNS_PATH]

    def run_ids(self) -> list[str]:
        return [run["run_id"] for run in self.runs()]


@contextmanager
def scripted_server(*answers: Answer) -> Iterator[ScriptedServer]:
    state = ScriptedServer(url="", answers=list(answers) or [Answer(201)])
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's naming
            body = self.rfile.read(int(self.headers["Content-Length"]))
            with lock:
                state.requests.append((self.path, dict(self.headers), body))
                if self.path == MISSING_PATH:
                    asked = json.loads(body)
                    answer = Answer(200, {"missing": asked["hashes"],
                                          "missing_manifests": asked["manifests"]})
                else:
                    answer = state.answers.pop(0) if len(state.answers) > 1 else state.answers[0]
            # As numparity answers: a run's answer, or its JSON error.
            default = ({"id": 1, "run_id": "x", "results": 0} if answer.status < 400 else
                       {"error": "scripted", "detail": f"a scripted {answer.status}"})
            payload = json.dumps(answer.body if answer.body is not None
                                 else default).encode()
            self.send_response(answer.status)
            for key, value in answer.headers.items():
                self.send_header(key, value)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        httpd.shutdown()
        httpd.server_close()

# A small environment document under its own key (the server derives it, design §3.1).
ENVIRONMENT = {"torch": {"version": "2.13.0"}}
ENVIRONMENT = {"env_key": compute_env_key(ENVIRONMENT), **ENVIRONMENT}


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


class FakeSleep:
    """Records the delays the agent asks for instead of sleeping."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


def small_document(finished_at: str, *, run_id: str | None = None) -> dict[str, Any]:
    """A run document without tensors (one request an upload)."""
    return {"schema": "numparity.run/v1", "run_id": run_id or str(uuid.uuid4()),
            "finished_at": finished_at, "results": []}


def valid_document(node: str, finished_at: str = "2026-11-21T10:00:41Z") -> dict[str, Any]:
    """A run document the real server stores: agent fingerprints of small tensors."""
    import torch

    from numparity_agent.testing import fingerprint

    generator = torch.Generator().manual_seed(11)
    tensors = [{"name": name, "kind": kind, "order": order,
                **fingerprint(torch.randn(shape, generator=generator))}
               for order, (name, kind, shape) in enumerate(
                   [("fc1", "layer", (4, 8)), ("output", "output", (4, 3))])]
    return {
        "schema": "numparity.run/v1", "run_id": str(uuid.uuid4()),
        "node": {"name": node, "labels": {}}, "agent_version": "0.1.0",
        "started_at": "2026-11-21T10:00:00Z", "finished_at": finished_at, "drill": False,
        "environment": copy.deepcopy(ENVIRONMENT),
        "results": [{"suite": "standard", "workload": "mlp", "workload_version": 1,
                     "variant": "default", "device": "cpu", "status": "ok",
                     "input_hash": "i" * 64, "param_hash": "p" * 64, "repeats": 1,
                     "repeats_agree": True, "wall_s": 0.1, "tensors": copy.deepcopy(tensors)}],
    }


def agent(*args: str, env: dict[str, str] | None = None, timeout: float = 180,
          **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """The installed `numparity-agent ARGS` in a clean environment (no NUMPARITY_*)."""
    return subprocess.run([AGENT, *args], env=env if env is not None else clean_env(),
                          capture_output=True, text=True, timeout=timeout, check=False,
                          **kwargs)


def names(folder: Path, pattern: str = "*") -> list[str]:
    return sorted(p.name for p in folder.glob(pattern)) if folder.is_dir() else []


def files_text(folder: Path) -> str:
    """Every file's text under `folder` (spool, rejected/, quarantine/, .reason files)."""
    texts = []
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            texts.append(path.read_bytes().decode("utf-8", "replace"))
    return "\n".join(texts)


class _FillsUp:
    """A file whose write stores the first KiB, then finds the disk full."""

    def __init__(self, file: Any) -> None:
        self._file = file

    def write(self, data: bytes) -> int:
        self._file.write(data[:1024])
        self._file.flush()
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._file, name)

    def __enter__(self) -> _FillsUp:
        return self

    def __exit__(self, *exc: object) -> None:
        self._file.close()


def fill_the_disk(monkeypatch: Any) -> None:
    """From now on the spool's writes find the disk full (ENOSPC), after a partial write."""
    from numparity_agent import _spool

    def opener(path: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        file = builtins.open(path, mode, *args, **kwargs)
        return _FillsUp(file) if "w" in mode else file

    monkeypatch.setattr(_spool, "open", opener, raising=False)
