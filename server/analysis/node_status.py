"""A node's statuses in the audit: ``suspect`` or ``watch`` (``audit.suspect_statuses``),
``nondeterministic``, ``stale`` (no upload for ``stale_after_hours``), or ``ok`` when it
is none of those. The audit's summary and /metrics count nodes per status."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

STATUSES = ("ok", "suspect", "watch", "nondeterministic", "stale")


@dataclass(frozen=True)
class StaleNode:
    node: str
    last_seen: datetime
    hours_since: float  # to a tenth of an hour


def stale_nodes(last_seen: Mapping[str, datetime], *, now: datetime,
                stale_after_hours: float) -> list[StaleNode]:
    """Nodes whose newest upload arrived more than ``stale_after_hours`` before ``now``,
    the longest silent first."""
    limit = now - timedelta(hours=stale_after_hours)
    found = [StaleNode(node, seen, round((now - seen).total_seconds() / 3600, 1))
             for node, seen in last_seen.items() if seen < limit]
    return sorted(found, key=lambda entry: (-entry.hours_since, entry.node))


def node_statuses(names: Iterable[str], *, suspects: Mapping[str, str],
                  nondeterministic: Iterable[str], stale: Iterable[str]
                  ) -> dict[str, set[str]]:
    """Each node's statuses (``suspects``: node → suspect or watch); ``ok`` when it has
    none of the others."""
    found: dict[str, set[str]] = {name: set() for name in names}
    for node, status in suspects.items():
        found[node].add(status)
    for node in nondeterministic:
        found[node].add("nondeterministic")
    for node in stale:
        found[node].add("stale")
    for statuses in found.values():
        if not statuses:
            statuses.add("ok")
    return found


def status_counts(statuses: Mapping[str, Collection[str]]) -> dict[str, int]:
    """Nodes per status (a node can count under several)."""
    return {status: sum(1 for found in statuses.values() if status in found)
            for status in STATUSES}


def flagged_counts(nodes: int, *, suspects: Mapping[str, str],
                   nondeterministic: Iterable[str], stale: Iterable[str]) -> dict[str, int]:
    """``status_counts`` of a fleet of ``nodes`` nodes from its flagged ones alone: a node
    none of these name is ``ok`` (the audit of 100,000 nodes lists the few hundred it
    flags, not the fleet)."""
    flagged = node_statuses(set(suspects) | set(nondeterministic) | set(stale),
                            suspects=suspects, nondeterministic=nondeterministic,
                            stale=stale)
    counts = status_counts(flagged)
    counts["ok"] = nodes - len(flagged)
    return counts
