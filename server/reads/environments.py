"""Environments' flattened attributes, kept by env_key: what /divergence's attribution and
the audit's policy read of every environment of the fleet.

An environment's document never changes (its env_key names it), so its flattening is
kept in the process, bounded, the least recently used going first: a lab of thousands of
environments is not read and flattened again on every request.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping

from sqlalchemy import select
from sqlalchemy.orm import Session

from numparity_server.analysis import flatten_environment
from numparity_server.kit.db import chunked
from numparity_server.models import Environment

KEPT = 4096
_kept: OrderedDict[str, dict[str, str]] = OrderedDict()
_lock = threading.Lock()


def flattened(session: Session, environments: Mapping[str, int]) -> dict[str, dict[str, str]]:
    """env_key → the flattened environment, for ``environments`` (env_key → its id):
    the kept ones, and the others read, flattened and kept."""
    with _lock:
        found = {key: _kept[key] for key in environments if key in _kept}
        for key in found:
            _kept.move_to_end(key)
    missing = sorted(env_id for key, env_id in environments.items() if key not in found)
    fresh: dict[str, dict[str, str]] = {}
    for part in chunked(missing):
        fresh.update((key, flatten_environment(document)) for key, document in session.execute(
            select(Environment.env_key, Environment.document).where(Environment.id.in_(part))))
    if fresh:
        found.update(fresh)
        with _lock:
            _kept.update(fresh)
            while len(_kept) > KEPT:
                _kept.popitem(last=False)
    return found
