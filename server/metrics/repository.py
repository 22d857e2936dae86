"""Queries behind the fleet metrics: each aggregates in the database and returns few rows
(or one row per node), so a scrape of a 10,000-node lab stays cheap."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from numparity_server.kit.db import codepoint_order
from numparity_server.models import LatestCount, Node, Outcome

Key = tuple[str, str, str]  # suite, workload, variant


def latest_ok_answers(session: Session) -> Sequence[Any]:
    """The fleet's latest ok results by outcome, a few hundred rows read from the counts
    ingest keeps (``latest_counts``): (suite, workload, variant, workload_version,
    input_hash, param_hash, manifest_hash, nodes, first_node)."""
    per_outcome = (
        select(LatestCount.suite, LatestCount.workload, LatestCount.variant,
               LatestCount.outcome_id, func.sum(LatestCount.devices).label("nodes"),
               func.min(codepoint_order(session, LatestCount.first_node)).label("first_node"))
        .where(LatestCount.devices > 0)
        .group_by(LatestCount.suite, LatestCount.workload, LatestCount.variant,
                  LatestCount.outcome_id)
        .subquery()
    )
    return session.execute(
        select(per_outcome.c.suite, per_outcome.c.workload, per_outcome.c.variant,
               Outcome.workload_version, Outcome.input_hash, Outcome.param_hash,
               Outcome.manifest_hash, per_outcome.c.nodes, per_outcome.c.first_node)
        .join(Outcome, Outcome.id == per_outcome.c.outcome_id)
        .where(Outcome.status == "ok", Outcome.manifest_hash.is_not(None))
    ).all()


def last_run_ages(session: Session, *, now: datetime, buckets: Sequence[float]
                  ) -> list[int]:
    """How many nodes' newest runs started at most each of ``buckets`` seconds before
    ``now`` (the start of a node that sent none: when it was last seen), then how many
    nodes: one aggregate over ``nodes``, whatever the fleet's size."""
    started = func.coalesce(Node.newest_started_at, Node.last_seen)
    row = session.execute(select(
        *(func.coalesce(func.sum(case((started >= now - timedelta(seconds=bucket), 1),
                                      else_=0)), 0) for bucket in buckets),
        func.count())).one()
    return [int(value) for value in row]


def oldest_last_runs(session: Session, *, limit: int) -> Sequence[Any]:
    """The ``limit`` nodes whose newest run started longest ago: (name, started)."""
    started = func.coalesce(Node.newest_started_at, Node.last_seen).label("started")
    return session.execute(
        select(Node.name, started).order_by(started, Node.name).limit(limit)).all()
