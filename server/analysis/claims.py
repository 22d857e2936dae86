"""What a reader may believe of text and findings a node sent (design §3.3.17).

An `explain` finding is the explaining node's claim: "under this setting I give the
other node's bits". The server cannot rerun it, but it can check the setting against
what the other side recorded of itself: a setting that makes a node agree with another
usually is that other node's configuration (its variable set, its knob off). A setting
found there is ``in_reference_environment``; one that is not is
``not_in_reference_environment`` (the claim rests on the explaining node's word only);
a finding without a setting is ``unchecked``.

Free text from nodes (a finding's ``detail``, a label) is shown as data, never as a
link or markup; text that reads like a shell command is marked so that nobody pastes it
into a terminal believing the server suggests it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

Verified = Literal["in_reference_environment", "not_in_reference_environment", "unchecked"]

# A pipe into a program, a command separator, a substitution, a redirection into a
# path, or a program that fetches or runs code: what makes text look runnable.
_SHELL = re.compile(
    r"\|\s*[\w/.-]|;\s*\w|&&|\$\(|`|>\s*/|(?:^|\s)(?:curl|wget|sh|bash|sudo|rm|chmod|python\d?"
    r"|eval|exec|nc)(?:\s|$)|LD_PRELOAD|LD_LIBRARY_PATH")


def looks_like_command(text: str | None) -> bool:
    """Whether node text reads like a shell command (to be marked, never run)."""
    return bool(text) and _SHELL.search(text) is not None  # type: ignore[arg-type]


def verify_setting(setting: Mapping[str, Any] | None,
                   reference_environment: Mapping[str, Any] | None) -> tuple[Verified, str]:
    """(verdict, one sentence) for a finding's ``setting`` against the reference run's
    recorded environment document (its ``env_vars`` and ``knobs``)."""
    if not setting or not (setting.get("env") or setting.get("knobs")):
        return "unchecked", "no setting to check: the explaining node's word only"
    if reference_environment is None:
        return "unchecked", "the reference run's environment is not stored"
    env_vars = reference_environment.get("env_vars")
    knobs = reference_environment.get("knobs")
    env_vars = env_vars if isinstance(env_vars, Mapping) else {}
    knobs = knobs if isinstance(knobs, Mapping) else {}
    missing = [f"{name}={'unset' if value is None else value}"
               for name, value in (setting.get("env") or {}).items()
               if env_vars.get(name) != value]
    missing += [f"{name}={value}" for name, value in (setting.get("knobs") or {}).items()
                if name not in knobs or knobs[name] != value]
    if missing:
        return ("not_in_reference_environment",
                f"not in the reference's recorded environment: {', '.join(missing)} "
                "(the explaining node's claim only)")
    return "in_reference_environment", "the reference's recorded environment has this setting"
