"""Upload run documents, through a spool that survives an unreachable server.

A document is written to the spool (atomically: temporary file, then os.replace)
before it is uploaded and deleted after a 2xx answer, so a crash or a network outage
never loses a run. A document the server rejects for good (4xx other than 408/429)
moves to `rejected/` so it is not retried forever. The token is never logged.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from numparity_agent._log import log

DEFAULT_TIMEOUT_S = 30.0
RUNS_PATH = "/api/v1/runs"


def default_spool_dir() -> Path:
    configured = os.environ.get("NUMPARITY_SPOOL")
    if configured:
        return Path(configured)
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(Path.home(), ".local", "state")
    return Path(state) / "numparity" / "spool"


def spool_document(document: dict[str, Any], spool_dir: Path) -> Path:
    """Write the document to the spool atomically; the file name sorts oldest first."""
    spool_dir.mkdir(parents=True, exist_ok=True)
    stamp = document.get("finished_at", "").replace(":", "").replace("-", "")
    path = spool_dir / f"{stamp}-{document['run_id']}.json"
    tmp = spool_dir / f".{path.name}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(document, f, separators=(",", ":"))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def spooled(spool_dir: Path) -> list[Path]:
    if not spool_dir.is_dir():
        return []
    return sorted(p for p in spool_dir.glob("*.json") if not p.name.startswith("."))


@dataclass(frozen=True)
class UploadOutcome:
    """`status` is the HTTP status, or None when the server could not be reached."""

    status: int | None
    detail: str

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300

    @property
    def retry(self) -> bool:
        """Worth trying again later (unreachable, server error, throttled)."""
        return self.status is None or self.status >= 500 or self.status in (408, 429)


def upload_bytes(
    body: bytes, *, server: str, token: str | None, timeout: float = DEFAULT_TIMEOUT_S
) -> UploadOutcome:
    """POST a JSON document (already serialised) gzip-compressed to the server."""
    headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    url = server.rstrip("/") + RUNS_PATH
    try:
        response = httpx.post(url, content=gzip.compress(body), headers=headers, timeout=timeout)
    except httpx.HTTPError as exc:
        return UploadOutcome(None, f"{url} unreachable: {type(exc).__name__}: {exc}")
    detail = response.text[:500]
    return UploadOutcome(response.status_code, detail)


def upload_document(
    document: dict[str, Any],
    *,
    server: str,
    token: str | None,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> UploadOutcome:
    body = json.dumps(document, separators=(",", ":")).encode()
    return upload_bytes(body, server=server, token=token, timeout=timeout)


def _settle(path: Path, outcome: UploadOutcome, log_line: Callable[[str], None]) -> None:
    if outcome.ok:
        path.unlink(missing_ok=True)
        log_line(f"uploaded {path.name} (HTTP {outcome.status})")
    elif outcome.retry:
        log_line(
            f"kept {path.name} in the spool: "
            + (f"HTTP {outcome.status}" if outcome.status else outcome.detail)
        )
    else:
        rejected = path.parent / "rejected"
        rejected.mkdir(exist_ok=True)
        os.replace(path, rejected / path.name)
        log_line(
            f"server rejected {path.name} (HTTP {outcome.status}): {outcome.detail}; "
            f"moved to {rejected}"
        )


def send_spooled(
    path: Path,
    *,
    server: str,
    token: str | None,
    timeout: float = DEFAULT_TIMEOUT_S,
    log_line: Callable[[str], None] = log,
) -> UploadOutcome:
    """Upload one spooled document and settle it (delete, keep or move to rejected/)."""
    outcome = upload_bytes(path.read_bytes(), server=server, token=token, timeout=timeout)
    _settle(path, outcome, log_line)
    return outcome


def flush(
    spool_dir: Path,
    *,
    server: str,
    token: str | None,
    timeout: float = DEFAULT_TIMEOUT_S,
    log_line: Callable[[str], None] = log,
) -> list[UploadOutcome]:
    """Upload what is spooled, oldest first; stop at the first unreachable answer."""
    outcomes = []
    for path in spooled(spool_dir):
        outcome = send_spooled(path, server=server, token=token, timeout=timeout, log_line=log_line)
        outcomes.append(outcome)
        if outcome.status is None:
            break
    return outcomes
