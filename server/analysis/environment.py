"""Flatten an environment document (design §2.5) into attributes for attribution."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

# Identity, not numerics: they name a machine, so they would "explain" every split.
IDENTITY_KEYS = frozenset({"env_key", "hostname", "uuid", "serial"})
# What could not be read; the reasons are not attributes of the environment.
UNKNOWN_KEY = "unknown"
UNSET = "unset"


def _render(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def _walk(node: Any, path: str, out: dict[str, str]) -> None:
    if isinstance(node, Mapping):
        for key, child in node.items():
            key = str(key)
            if key in IDENTITY_KEYS or (key == UNKNOWN_KEY and isinstance(child, Mapping)):
                continue
            _walk(child, f"{path}.{key}" if path else key, out)
    elif isinstance(node, (list, tuple)) and any(isinstance(item, Mapping) for item in node):
        for index, item in enumerate(node):
            _walk(item, f"{path}.{index}", out)
    elif isinstance(node, (list, tuple)):
        out[path] = json.dumps(list(node), separators=(",", ":"), default=str)
    else:
        out[path] = _render(node)


def flatten_environment(environment: Mapping[str, Any]) -> dict[str, str]:
    """Dotted paths of scalar leaves → their values as strings.

    Lists of objects are indexed (``gpus.0.name``), lists of scalars become one JSON
    string (``gpus`` is ``"[]"`` on a CPU node); ``True`` → ``"true"``, ``None`` →
    ``"null"``. Identity keys (``env_key``, ``hostname``, ``uuid``, ``serial``) and the
    ``unknown`` sub-document are left out wherever they appear. An attribute a document
    does not have is ``UNSET`` ("unset") when documents are compared.
    """
    out: dict[str, str] = {}
    _walk(environment, "", out)
    return out


def environment_diff(a: Mapping[str, str], b: Mapping[str, str]) -> list[dict[str, str]]:
    """Attributes whose values differ between two flattened environments, by name:
    ``{"attribute", "a", "b"}`` with ``UNSET`` for an attribute one side lacks."""
    return [
        {"attribute": name, "a": a.get(name, UNSET), "b": b.get(name, UNSET)}
        for name in sorted(a.keys() | b.keys())
        if a.get(name, UNSET) != b.get(name, UNSET)
    ]


# A value longer than this (or of several lines) is a blob to a reader: torch's build
# config, parallel_info, a CPU's flag list. It is shown as the part that differs.
SHORT_VALUE = 40
_CONTEXT = 12


def is_blob(value: str) -> bool:
    return "\n" in value or len(value) > SHORT_VALUE


def short_difference(a: str, b: str) -> tuple[str, str]:
    """Two values as a person compares them: short ones whole; of long or multi-line ones
    the first line that differs (with its number), cut to the part that differs with a
    little context on either side. The whole values stay where they came from."""
    if not (is_blob(a) or is_blob(b)):
        return a, b
    lines_a, lines_b = a.split("\n"), b.split("\n")
    where = ""
    if len(lines_a) > 1 or len(lines_b) > 1:
        index = next((i for i, (x, y) in enumerate(zip(lines_a, lines_b, strict=False)) if x != y),
                     min(len(lines_a), len(lines_b)))
        where = f"line {index + 1}: "
        # Indentation says nothing about what differs.
        a = lines_a[index].strip() if index < len(lines_a) else "(no line)"
        b = lines_b[index].strip() if index < len(lines_b) else "(no line)"
    if not (is_blob(a) or is_blob(b)):
        return where + a, where + b
    return where + _cut(a, b), where + _cut(b, a)


def _cut(value: str, other: str) -> str:
    """``value`` around where it first differs from ``other``, with "…" for what is cut."""
    start = next((i for i, (x, y) in enumerate(zip(value, other, strict=False)) if x != y),
                 min(len(value), len(other)))
    # The common tail, so the shown part ends where the values agree again.
    tail = 0
    while (tail < len(value) - start and tail < len(other) - start
           and value[-1 - tail] == other[-1 - tail]):
        tail += 1
    lo = max(0, start - _CONTEXT)
    hi = min(len(value), max(len(value) - tail, start) + _CONTEXT)
    if hi - lo > 2 * SHORT_VALUE:
        hi = lo + 2 * SHORT_VALUE
    return ("…" if lo > 0 else "") + value[lo:hi] + ("…" if hi < len(value) else "")


def _without_identity(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _without_identity(child) for key, child in value.items()
                if key not in IDENTITY_KEYS and key != UNKNOWN_KEY}
    if isinstance(value, list):
        return [_without_identity(child) for child in value]
    return value


def derived_env_key(environment: Mapping[str, Any]) -> str:
    """The ``env_key`` of an environment document, as the agent computes it (design §2.5):
    sha256 of the JSON of the document without the identity keys and ``unknown`` at any
    depth, its ``gpus`` as the sorted set of GPU models (each without its ``index``, as
    JSON with sorted keys): which and how many GPUs a scheduler exposed is not the
    environment. Keys sorted, no spaces, ASCII escapes. The server computes it rather
    than trusting the one declared: a node cannot file its environment under another's
    key."""
    stripped = _without_identity(environment)
    gpus = stripped.get("gpus")
    if isinstance(gpus, list):
        stripped["gpus"] = sorted({
            json.dumps({k: v for k, v in gpu.items() if k != "index"}, sort_keys=True,
                       separators=(",", ":"), default=str)
            if isinstance(gpu, Mapping) else json.dumps(gpu, default=str) for gpu in gpus})
    canonical = json.dumps(stripped, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def legacy_env_key(environment: Mapping[str, Any]) -> str:
    """The ``env_key`` agents before issue 42 computed: ``gpus`` as listed, index and
    all. Accepted beside ``derived_env_key`` so that a fleet's agents can be upgraded
    one node at a time (a key is still the key of the document beside it)."""
    canonical = json.dumps(_without_identity(environment), sort_keys=True,
                           separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()
