"""One agent at a time per spool: an exclusive flock on `<spool>/.lock`.

A cron job that runs longer than its period, or a person's `flush` during a timer's
run, must not run the suite twice at once (two suites on one GPU distort each other's
timings) nor upload one document twice side by side. The kernel drops a flock when its
process dies, so a lock file left by a crashed or killed agent is simply taken over; the
pid and start time written into the file only serve the messages. The file is never
deleted (deleting a locked file lets a third process lock a new one beside it).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from numparity_agent._log import utc_stamp

LOCK_NAME = ".lock"


class LockBusy(RuntimeError):
    """Another live process holds the spool's lock; `holder` is what it wrote."""

    def __init__(self, path: Path, holder: str) -> None:
        self.path = path
        self.holder = holder
        super().__init__(f"another numparity-agent holds {path} "
                         f"({holder or 'it has not said who it is yet'})")


def _describe(text: str) -> str:
    """'pid 123, numparity-agent run since 2026-...' from the lock file's line."""
    return " ".join(text.split())[:200]


@contextmanager
def spool_lock(spool_dir: Path, command: str) -> Iterator[str]:
    """Hold the spool's lock while the block runs; yields what a previous holder that
    died without releasing it had written ('' when the lock was free and clean).

    Raises LockBusy when a live process holds it, OSError when the spool folder or the
    lock file cannot be created."""
    spool_dir.mkdir(parents=True, exist_ok=True)
    path = spool_dir / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LockBusy(path, _describe(_read(fd))) from None
        # A clean release empties the file: text left in it is a holder that died.
        previous = _describe(_read(fd))
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()}, numparity-agent {command} since {utc_stamp()}\n"
                      .encode(), 0)
        except OSError:  # a full disk: the lock holds all the same, only unnamed
            pass
        try:
            yield previous
        finally:
            try:
                os.ftruncate(fd, 0)
            except OSError:
                pass
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _read(fd: int) -> str:
    try:
        return os.pread(fd, 512, 0).decode("utf-8", "replace")
    except OSError:
        return ""
