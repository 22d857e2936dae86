"""What the end-to-end tests share: uploading through the agent's own `flush`."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

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

