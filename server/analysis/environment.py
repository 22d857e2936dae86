"""Flatten an environment document (DESIGN §2.5) into attributes for attribution."""

from __future__ import annotations

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
