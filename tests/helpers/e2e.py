"""What the end-to-end tests share: uploading through the agent's own `flush`."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from helpers.processes import server_command
from numparity_agent.testing import spooled


def upload_with_agent(documents: Sequence[Path], server: Any, spool: Path,
                      token: str | None = None) -> None:
    """Spool the run documents, then `numparity-agent flush` them to the live server
    (with ``token``, else the server's unbound agent token).

    The spool's file names keep the documents' order (a node's runs in the order they
    were measured)."""
    spool.mkdir()
    for index, path in enumerate(documents):
        (spool / f"{index:02d}-{path.name}").write_bytes(path.read_bytes())
    done = subprocess.run(
        [sys.executable, "-m", "numparity_agent", "flush", "--server", server.base_url,
         "--spool", str(spool)],
        env={**os.environ, "NUMPARITY_TOKEN": token or server.agent_token},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert spooled(spool) == [], "flush left documents in the spool"


def create_tokens(server: Any, bindings: Mapping[str, Sequence[str]]) -> dict[str, str]:
    """label → a new token made by `numparity-server token create --label LABEL ARGS`
    (``bindings``: label → ARGS, e.g. ``["--role", "agent", "--node", "gpu-1"]``), all
    made side by side."""
    env = {**os.environ, "NUMPARITY_DATABASE_URL": server.database_url}
    processes = {label: subprocess.Popen(
        [*server_command(), "token", "create", "--label", label, *args], env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for label, args in bindings.items()}
    tokens = {}
    for label, process in processes.items():
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, f"token create {label} failed:\n{err}"
        tokens[label] = out.strip()
    return tokens
