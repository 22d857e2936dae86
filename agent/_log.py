"""What the agent says on stderr: one timestamped line per event, plus a progress line
when a person is watching.

Without a terminal (cron, systemd, a pipe) every event is one plain line,
`2026-11-22T10:00:00Z numparity-agent: ...` (UTC), and nothing else: no colours, no
carriage returns. On a terminal the same lines appear, and below them one line that is
redrawn in place, `[3/12] cnn/strict 0:42`, until the run ends.

Secrets registered with `hide` (the agent token) are replaced by `***` in every line,
whatever produced it: an exception text or a server's answer never leaks the token.
"""

from __future__ import annotations

import os
import sys
import time

_MASK = "***"
_hidden: set[str] = set()
_progress_line = ""


def hide(secret: str | None) -> None:
    """Never print `secret`: every log line and `redact` mask it from now on."""
    if secret and len(secret) >= 4:  # masking a 1-3 character "token" would garble text
        _hidden.add(secret)


def redact(text: str) -> str:
    for secret in sorted(_hidden, key=len, reverse=True):
        text = text.replace(secret, _MASK)
    return text


def utc_stamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def interactive() -> bool:
    """Whether stderr is a terminal a person watches (a progress line makes sense)."""
    stream = sys.stderr
    try:
        return bool(stream.isatty()) and os.environ.get("TERM") != "dumb"
    except (AttributeError, ValueError):  # a replaced or closed stream
        return False


def _width() -> int:
    try:
        columns = os.get_terminal_size(sys.stderr.fileno()).columns
    except (AttributeError, ValueError, OSError):
        columns = 0
    return max(20, columns) if columns else 80  # 0: a terminal that does not say


def log(message: str) -> None:
    line = f"{utc_stamp()} numparity-agent: {redact(message)}"
    stream = sys.stderr
    if _progress_line and interactive():
        # Erase the progress line, print the event, draw the progress line again below it.
        stream.write(f"\r\x1b[K{line}\n{_progress_line}")
        stream.flush()
    else:
        print(line, file=stream, flush=True)


def progress(text: str) -> None:
    """Show `text` as the progress line (on a terminal only; elsewhere nothing)."""
    global _progress_line
    if not interactive():
        return
    _progress_line = redact(text)[: _width() - 1]
    sys.stderr.write(f"\r\x1b[K{_progress_line}")
    sys.stderr.flush()


def end_progress() -> None:
    """Erase the progress line (the terminal is left as the event lines made it)."""
    global _progress_line
    if _progress_line and interactive():
        sys.stderr.write("\r\x1b[K")
        sys.stderr.flush()
    _progress_line = ""
