"""Canonical JSON for content hashes the server computes for itself (document, outcome).

orjson with sorted keys: the ingest hot path hashes ~40 KiB of knobs a run, which
``json.dumps(sort_keys=True)`` made the largest single cost of storing a run. A value
orjson cannot encode (an integer beyond 64 bits, which JSON allows) takes the standard
library's form instead; either way the same value always gives the same bytes.
Hashes that are part of the wire contract (the manifest hash the agent computes too)
keep the standard library's form and do not use this.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import orjson


def canonical_json(value: Any) -> bytes:
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except (TypeError, orjson.JSONEncodeError):
        return json.dumps(value, sort_keys=True, separators=(",", ":"),
                          ensure_ascii=False).encode("utf-8")


def content_hash(value: Any) -> str:
    """sha256 hex of the canonical JSON of ``value``."""
    return hashlib.sha256(canonical_json(value)).hexdigest()
