"""`check`'s budget (design §2.12): a deadline counted from the process's start, and a
watchdog that ends the command at the budget's end whatever a step is doing.

This module does not import torch.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable

# Kept back from the budget for comparing, printing and the interpreter's exit, so the
# whole command ends within it (the budget counts from the process's start).
RESERVE_S = 1.0


def process_age() -> float | None:
    """Seconds since this process started (Linux: /proc), so that the budget also counts
    the interpreter's start and imports; None where it cannot be read."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            # The command name (field 2) may hold spaces: the fields after it follow ")".
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime", encoding="ascii") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


# A process older than this when `check` begins was not started for it (a test, a program
# calling `main`): its budget counts from `main` instead of the process's start.
STARTUP_LIMIT_S = 15.0


def budget_start(main_started: float) -> float:
    """When the budget began: the process's start (its interpreter and imports count),
    unless the process was running long before `main` was called."""
    age = process_age()
    if age is None or age > STARTUP_LIMIT_S:
        return main_started
    return min(main_started, time.monotonic() - age)


class Deadline:
    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic,
                 started: float | None = None) -> None:
        self.clock = clock
        self.started = clock() if started is None else started
        self.at = self.started + max(0.0, seconds - RESERVE_S)

    def left(self) -> float:
        return max(0.0, self.at - self.clock())

    def elapsed(self) -> float:
        return self.clock() - self.started


# The watchdog fires this long before the budget ends: its own work (killing children,
# one line, the exit) fits in it.
WATCHDOG_MARGIN_S = 0.2


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux: /proc), and theirs, deepest first."""
    found: list[int] = []
    try:
        entries = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return found
    parents: dict[int, list[int]] = {}
    for name in entries:
        try:
            with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        parents.setdefault(ppid, []).append(int(name))

    def walk(parent: int) -> None:
        for child in parents.get(parent, []):
            walk(child)
            found.append(child)

    walk(pid)
    return found


class Watchdog:
    """The budget's backstop: should a step overrun its share (a machine so loaded that a
    killed child takes seconds to go), at the budget's end it kills this process's
    children, writes the out-of-time verdict and exits."""

    def __init__(self, deadline: Deadline, seconds: float,
                 finish: Callable[[float], int]) -> None:
        self._finish = finish
        delay = max(0.0, deadline.started + seconds - WATCHDOG_MARGIN_S - deadline.clock())
        self._timer = threading.Timer(delay, self._fire)
        self._timer.daemon = True
        self._deadline = deadline

    def __enter__(self) -> Watchdog:
        self._timer.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._timer.cancel()

    def _fire(self) -> None:
        for child in _children(os.getpid()):
            try:
                os.kill(child, signal.SIGKILL)
            except OSError:
                pass
        code = self._finish(self._deadline.elapsed())
        os._exit(code)
