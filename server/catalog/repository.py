"""The outcomes the fleet's newest results hold, counted: the catalog's one query."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from numparity_server.kit.db import chunked
from numparity_server.models import LatestCount, Outcome


@dataclass(frozen=True)
class SeenOutcome:
    """One distinct outcome among the newest results, and how many nodes hold it."""

    suite: str
    workload: str
    workload_version: int | None
    variant: str
    device: str
    status: str
    manifest_hash: str | None
    nodes: int


def seen_outcomes(session: Session, *, suite: str | None = None,
                  workload: str | None = None) -> list[SeenOutcome]:
    """Every distinct outcome of the newest results (of ``suite``/``workload`` if given).

    Read from the counts ingest keeps (``latest_counts``: a row per outcome, environment
    and device model), then the few distinct outcomes by id: a fleet of 100,000 nodes
    holds a few hundred of them.
    """
    counted = (select(LatestCount.outcome_id, func.sum(LatestCount.devices))
               .where(LatestCount.devices > 0).group_by(LatestCount.outcome_id))
    if suite is not None:
        counted = counted.where(LatestCount.suite == suite)
    if workload is not None:
        counted = counted.where(LatestCount.workload == workload)
    nodes = {int(outcome_id): int(count) for outcome_id, count in session.execute(counted)}
    found: list[SeenOutcome] = []
    for part in chunked(sorted(nodes)):
        rows = session.execute(
            select(Outcome.id, Outcome.suite, Outcome.workload, Outcome.workload_version,
                   Outcome.variant, Outcome.device, Outcome.status, Outcome.manifest_hash)
            .where(Outcome.id.in_(part)))
        found.extend(SeenOutcome(row.suite, row.workload, row.workload_version, row.variant,
                                 row.device, row.status, row.manifest_hash, nodes[row.id])
                     for row in rows)
    return found



def suites(session: Session) -> list[str]:
    """Every suite some node has a newest result in."""
    return sorted(session.scalars(
        select(LatestCount.suite).where(LatestCount.devices > 0).distinct()))
