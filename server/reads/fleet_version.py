"""The fleet's version: what the fleet-wide reads are kept against (`kit.readcache`).

A counter in one row (``models.fleet_version``) that every write those reads depend on
advances in its own transaction (``kit.db.writing``): an upload (a node's latest results,
its environment, its devices), `explain`'s findings, a pin's new version, a device
moved, the whole values of a tensor arriving in parts, retention dropping runs. It
changes when such a write commits, not when it inserts (run ids are handed out at
insert: a slow upload committing after a fast one changed no maximum id), so an answer
kept against it is as of the newest commit, on every replica. Only the clock moves the
audit's "stale" without a write: that reaches the answers within the cache's maximum
age.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from numparity_server.models import FLEET_VERSION_ROW, FleetVersion


def fleet_version(session: Session) -> tuple[int]:
    """The counter (0 before any write)."""
    version = session.scalar(select(FleetVersion.version)
                             .where(FleetVersion.id == FLEET_VERSION_ROW))
    return (int(version or 0),)
