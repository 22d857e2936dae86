"""The fleet's version: what the fleet-wide reads are kept against (`kit.readcache`).

Every write that changes what `/audit`, `/divergence` and the pages answer adds a row to
`runs` (ingest: a node's latest results, its environment, its devices), to
`explanations` (`explain`'s findings beside a split) or to `goldens` (a pin's new
version, an unpin included): the newest id of each is the version, read from their
primary keys' indexes in one statement, with the newest device move (`devices.moved_at`,
indexed: an admin confirming a claim, `numparity-server device move`, adds no run but
moves a device and its latest results from one node to another). Retention deletes old
runs without adding one, the clock moves the audit's "stale", and a large tensor's whole
values may arrive in parts after their run (`uploads`): those reach the answers within
the cache's maximum age.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from numparity_server.models import Device, Explanation, Golden, Run


def fleet_version(session: Session) -> tuple[int, int, int, int]:
    """(newest run id, newest explain finding id, newest pin version id, newest device
    move in microseconds since the epoch); 0 where there is none."""
    row = session.execute(select(
        select(func.coalesce(func.max(Run.id), 0)).scalar_subquery(),
        select(func.coalesce(func.max(Explanation.id), 0)).scalar_subquery(),
        select(func.coalesce(func.max(Golden.id), 0)).scalar_subquery(),
        select(func.max(Device.moved_at)).scalar_subquery(),
    )).one()
    moved = row[3]
    if isinstance(moved, str):  # SQLite hands a scalar subquery's time back as text
        moved = datetime.fromisoformat(moved)
    moved_us = 0 if moved is None else int(moved.timestamp() * 1_000_000)
    return int(row[0]), int(row[1]), int(row[2]), moved_us
