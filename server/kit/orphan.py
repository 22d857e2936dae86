"""A worker of ``serve --workers N`` stops when its supervisor is gone.

uvicorn's supervisor starts the workers and stops them on SIGTERM or SIGINT. Killed with
SIGKILL (the OOM killer, ``kill -9``, a container runtime's last resort) it cannot: its
workers went on serving on the port they share, orphaned, and a new ``serve`` on that
port failed until someone found and killed them. Each worker watches its parent and,
once it is no longer the process that started it, stops the way SIGTERM stops it
(requests under way get the graceful seconds).
"""

from __future__ import annotations

import os
import signal
import threading

# How often a worker looks at its parent (seconds): an orphan serves at most this long.
POLL_S = 0.5


def stop_when_orphaned(poll_s: float = POLL_S) -> None:
    """In a worker process: SIGTERM to itself once its parent process is gone."""
    supervisor = os.getppid()

    def watch() -> None:
        while os.getppid() == supervisor:
            threading.Event().wait(poll_s)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="numparity-orphan-watch", daemon=True).start()
