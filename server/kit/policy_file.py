"""The lab's policy file (``NUMPARITY_POLICY_FILE``, TOML): read once when the app starts.

A missing or malformed file stops the server with a message naming the file and the
setting that is wrong, rather than an audit that silently checks nothing.
"""

from __future__ import annotations

import sys
from pathlib import Path

from numparity_server.analysis.policy import Policy, PolicyError, parse_policy

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


def load_policy(path: Path | str | None) -> Policy:
    """The policy in ``path``; the defaults (no rules) without one."""
    if path is None:
        return Policy()
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise PolicyError(f"policy file {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"policy file {path} is not valid TOML: {exc}") from None
    try:
        return parse_policy(raw)
    except PolicyError as exc:
        raise PolicyError(f"policy file {path}: {exc}") from None

