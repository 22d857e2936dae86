"""`numparity-agent spool`: what waits in the spool and why, and what the operator does
with a document the server refused.

Three places hold documents (`_spool`): the spool itself (waiting: the next run or
flush sends them), `rejected/` (the server refused them for their own content: a token
bound to another node, an invalid document; never retried by itself) and `quarantine/`
(not run documents at all). This module lists the three, with each one's reason (its
`.reason` file), moves a rejected document back into the spool to be sent again (once
the token may write it, say), and deletes the ones the operator gives up on. Sending is
`_flush`'s: `resend` only puts the document back where a flush takes it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from numparity_agent import _spool

WAITING = "waiting"
STATES = {WAITING: None, "rejected": _spool.REJECTED, "quarantined": _spool.QUARANTINE}


class SpoolEntryError(ValueError):
    """A name that is no document of the spool, or one that cannot be sent again."""


@dataclass(frozen=True)
class Entry:
    """One document of the spool, where it is and why."""

    path: Path
    state: str  # waiting, rejected or quarantined
    reason: str | None
    run_id: str | None
    node: str | None
    size: int

    def line(self) -> str:
        what = f"run {self.run_id} of node {self.node!r}" if self.run_id else "not a run"
        head = f"{self.state:<11} {self.path.name}  {what}, {self.size:,} bytes"
        return head + (f"\n            why: {self.reason}" if self.reason else "")


def _reason(path: Path) -> str | None:
    try:
        text = path.with_name(path.name + ".reason").read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return text or None


def _entry(path: Path, state: str) -> Entry:
    run_id = node = None
    try:
        document = json.loads(path.read_bytes())
        if isinstance(document, dict):
            run_id = document.get("run_id") if isinstance(document.get("run_id"), str) else None
            named = document.get("node")
            node = named.get("name") if isinstance(named, dict) else None
    except (OSError, ValueError):
        pass
    try:
        size = path.stat().st_size
    except OSError:
        size = 0
    return Entry(path, state, None if state == WAITING else _reason(path), run_id,
                 node if isinstance(node, str) else None, size)


def entries(spool_dir: Path) -> list[Entry]:
    """Every document: waiting (oldest first), then rejected, then quarantined."""
    found = [_entry(path, WAITING) for path in _spool.spooled(spool_dir)]
    for state, folder in STATES.items():
        if folder is None or not (spool_dir / folder).is_dir():
            continue
        found.extend(_entry(path, state) for path in sorted((spool_dir / folder).iterdir())
                     if path.is_file() and not path.name.endswith(".reason"))
    return found


def find(spool_dir: Path, names: list[str]) -> list[Entry]:
    """The entries named by file name or run_id; SpoolEntryError names any unknown."""
    every = entries(spool_dir)
    chosen: list[Entry] = []
    for name in names:
        matches = [e for e in every if name in (e.path.name, e.run_id)]
        if not matches:
            raise SpoolEntryError(f"{name!r} is no document of the spool {spool_dir} "
                                  "(`numparity-agent spool` lists them)")
        chosen.extend(m for m in matches if m not in chosen)
    return chosen


def resend(entry: Entry, spool_dir: Path) -> Path:
    """Put a rejected document back into the spool (the next flush sends it); its path."""
    if entry.state == WAITING:
        return entry.path
    if entry.state != "rejected" or entry.run_id is None:
        raise SpoolEntryError(f"{entry.path.name} is not a run document; it cannot be "
                              "sent (`numparity-agent spool drop` deletes it)")
    target = spool_dir / entry.path.name
    n = 1
    while target.exists():
        target = spool_dir / f"{entry.path.stem}.{n}.json"
        n += 1
    os.replace(entry.path, target)
    entry.path.with_name(entry.path.name + ".reason").unlink(missing_ok=True)
    return target


def drop(entry: Entry) -> None:
    """Delete a document and its reason."""
    entry.path.unlink(missing_ok=True)
    entry.path.with_name(entry.path.name + ".reason").unlink(missing_ok=True)


def render(found: list[Entry], spool_dir: Path) -> str:
    if not found:
        return f"nothing in the spool {spool_dir}\n"
    counts = {state: sum(e.state == state for e in found) for state in STATES}
    head = f"spool {spool_dir}: " + ", ".join(f"{n} {state}" for state, n in counts.items()
                                               if n)
    return "\n".join([head, *(e.line() for e in found)]) + "\n"
