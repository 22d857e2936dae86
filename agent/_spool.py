"""The spool: run documents waiting for the server, one JSON file each.

A document is written atomically (a temporary dot file, fsync, os.replace) before it is
uploaded and removed only after a 2xx answer, so a crash, a reboot or a network outage
never loses a run. File names start with the run's finish time, so they sort oldest
first. Beside the documents:

- `rejected/` — documents the server refused for good (a 4xx other than 401/403/408/429),
  each with a `.reason` file: never retried, never deleted;
- `quarantine/` — files that are not a run document (truncated, not JSON, not ours) and
  temporary files of a write that crashed, each with a `.reason` file;
- `.known-manifests.json` — what the server is known to store (`KnownManifests`);
- `.lock` — the lock of the agent working on this spool (`_lock`: one idea, a flock);
- `.values/` — large tensors' full values by hash (`_values`, which owns that folder:
  its file format, compression and pruning are the values store's own business; the
  spool only lends it a place, and never takes its dot folder for a run document).
"""

from __future__ import annotations

import errno
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from numparity_agent._log import log, redact, utc_stamp

REJECTED = "rejected"
QUARANTINE = "quarantine"
# A temporary file older than this belongs to a write that crashed (a write takes
# milliseconds; another process still writing would have a fresh file).
STALE_TMP_S = 600.0
RUN_SCHEMA_PREFIX = "numparity.run/"


class SpoolWriteError(OSError):
    """The spool could not take a document (disk full, read-only, no permission).

    An OSError with the same errno, whose message names the folder and the cause."""

    def __init__(self, spool_dir: Path, cause: OSError) -> None:
        reason = cause.strerror or str(cause)
        code = errno.errorcode.get(cause.errno or 0, "")
        super().__init__(cause.errno, f"cannot write to the spool {spool_dir}: {reason}"
                         + (f" ({code})" if code else ""))
        self.spool_dir = spool_dir


class CorruptSpoolFile(ValueError):
    """A file in the spool that is not a run document; the message says why."""


def default_spool_dir() -> Path:
    configured = os.environ.get("NUMPARITY_SPOOL")
    if configured:
        return Path(configured)
    state = os.environ.get("XDG_STATE_HOME")
    if not state:
        try:  # without HOME (cron, env -i) the password database names the home folder
            home = Path.home()
        except (KeyError, RuntimeError) as exc:
            raise RuntimeError("no spool folder: no home folder to put it in "
                               f"({exc}); set --spool or NUMPARITY_SPOOL") from exc
        state = os.path.join(home, ".local", "state")
    return Path(state) / "numparity" / "spool"


def temporary_path(path: Path) -> Path:
    """Where a write of `path` goes before its atomic rename: a dot file ending in .tmp,
    which `spooled()` never takes for a run document and `stale_temporary_files` finds."""
    return path.with_name(f".{path.name}.tmp")


def spool_document(document: dict[str, Any], spool_dir: Path) -> Path:
    """Write the document to the spool atomically; the file name sorts oldest first.

    Raises SpoolWriteError (an OSError) when the spool cannot take it; no partial file
    is left behind then."""
    stamp = document.get("finished_at", "").replace(":", "").replace("-", "")
    path = spool_dir / f"{stamp}-{document['run_id']}.json"
    tmp = temporary_path(path)
    body = json.dumps(document, separators=(",", ":")).encode("utf-8")
    try:
        spool_dir.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise SpoolWriteError(spool_dir, exc) from exc
    return path


def spooled(spool_dir: Path) -> list[Path]:
    """The documents waiting in the spool, oldest first."""
    if not spool_dir.is_dir():
        return []
    return sorted(p for p in spool_dir.glob("*.json") if not p.name.startswith("."))


def read_spooled(path: Path) -> dict[str, Any]:
    """The run document in `path`; CorruptSpoolFile when it is not one."""
    try:
        body = path.read_bytes()
    except OSError as exc:
        raise CorruptSpoolFile(f"unreadable: {exc.strerror or exc}") from exc
    if not body.strip():
        raise CorruptSpoolFile("empty file")
    try:
        document = json.loads(body)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise CorruptSpoolFile(f"not JSON, truncated or corrupt ({exc})") from exc
    if not (isinstance(document, dict)
            and str(document.get("schema", "")).startswith(RUN_SCHEMA_PREFIX)
            and isinstance(document.get("run_id"), str)
            and isinstance(document.get("results"), list)):
        raise CorruptSpoolFile(f"JSON but not a run document (no schema {RUN_SCHEMA_PREFIX}..., "
                               "run_id and results)")
    return document


def move_aside(path: Path, folder: str, reason: str) -> Path:
    """Move `path` into the spool's `folder` with `<name>.reason` beside it; the new path.

    Never overwrites: a name already there gets a numeric suffix. The reason file is
    best effort (a full disk still lets a rename through)."""
    target_dir = path.parent / folder
    target_dir.mkdir(exist_ok=True)
    name = path.name.lstrip(".")  # a temporary dot file shows up there too
    target = target_dir / name
    n = 1
    while target.exists():
        target = target_dir / f"{name}.{n}"
        n += 1
    os.replace(path, target)
    try:
        target.with_name(target.name + ".reason").write_text(
            f"{utc_stamp()} {redact(reason)}\n", encoding="utf-8")
    except OSError:
        pass
    return target


def stale_temporary_files(spool_dir: Path, *, older_than: float = STALE_TMP_S) -> list[Path]:
    """Temporary files of writes that crashed: dot files ending in .tmp, older than
    `older_than` seconds."""
    if not spool_dir.is_dir():
        return []
    now = time.time()
    stale = []
    for path in sorted(spool_dir.glob(".*.tmp")):
        try:
            if now - path.stat().st_mtime > older_than:
                stale.append(path)
        except OSError:  # gone meanwhile
            continue
    return stale


def known_manifests_file(spool_dir: Path) -> Path:
    # A dot file: spooled() never takes it for a run document.
    return spool_dir / ".known-manifests.json"


def is_cache_temporary(path: Path) -> bool:
    """Whether `path` is the temporary file of a cache write (`KnownManifests`): losing
    it loses nothing, so a crashed one is dropped rather than quarantined."""
    return path == temporary_path(known_manifests_file(path.parent))


class KnownManifests:
    """Manifests (and op traces, design §2.10: content-addressed alike, by sha256 of
    other content) this agent has seen a server store, remembered in a file of the spool.

    A node whose numbers do not change produces the same manifests run after run; with
    this memory it sends them as references without asking first: one request a run. A
    server that forgot one (retention) answers 422 naming it, and the upload falls back
    to asking. The file is a cache: unreadable or missing means "nothing known".
    """

    LIMIT = 4096  # the newest manifests kept: far more than one node's suite produces

    def __init__(self, path: Path | None, server: str) -> None:
        self._path = path
        self._server = server.rstrip("/")
        self._hashes: dict[str, None] = {}
        if path is not None:
            try:
                stored = json.loads(path.read_text(encoding="utf-8"))
                if isinstance(stored, dict) and stored.get("server") == self._server:
                    self._hashes = dict.fromkeys(h for h in stored.get("manifests", [])
                                                 if isinstance(h, str))
            except (OSError, ValueError):
                pass

    def __contains__(self, digest: str) -> bool:
        return digest in self._hashes

    def forget(self) -> None:
        self._hashes.clear()

    def remember(self, digests: Sequence[str]) -> None:
        for digest in digests:
            self._hashes.pop(digest, None)
            self._hashes[digest] = None
        for stale in list(self._hashes)[: max(0, len(self._hashes) - self.LIMIT)]:
            del self._hashes[stale]
        if self._path is None:
            return
        tmp = temporary_path(self._path)
        try:
            tmp.write_text(json.dumps({"server": self._server, "manifests": list(self._hashes)}),
                           encoding="utf-8")
            os.replace(tmp, self._path)
        except OSError as exc:  # a cache: the next run asks instead
            log(f"could not remember manifests in {self._path}: {exc}")
