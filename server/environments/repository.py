"""Queries of the environment inventory."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Select, distinct, func, select
from sqlalchemy.orm import Session

from numparity_server.kit.db import chunked
from numparity_server.models import Environment, Run


def _filtered(query: Select[Any], filters: dict[str, str]) -> Select[Any]:
    for column, value in filters.items():
        query = query.where(getattr(Environment, column) == value)
    return query


def count_environments(session: Session, filters: dict[str, str]) -> int:
    query = _filtered(select(func.count()).select_from(Environment), filters)
    return session.scalar(query) or 0


def environments_page(session: Session, filters: dict[str, str], *, limit: int, offset: int
                      ) -> Sequence[Environment]:
    query = _filtered(select(Environment), filters)
    return session.scalars(
        query.order_by(Environment.first_seen, Environment.id).limit(limit).offset(offset)
    ).all()


def usage(session: Session, environment_ids: Sequence[int]) -> dict[int, tuple[int, int]]:
    """environment id → (distinct nodes, runs)."""
    found: dict[int, tuple[int, int]] = {}
    for part in chunked(environment_ids):
        for environment_id, nodes, runs in session.execute(
            select(Run.environment_id, func.count(distinct(Run.node_id)), func.count())
            .where(Run.environment_id.in_(part)).group_by(Run.environment_id)
        ):
            found[environment_id] = (nodes, runs)
    return found


def current_nodes(session: Session, environment_ids: Sequence[int]) -> dict[int, int]:
    """environment id → nodes whose newest run (by started_at, then id) is on it."""
    ranked = select(
        Run.environment_id,
        func.row_number().over(partition_by=Run.node_id,
                               order_by=(Run.started_at.desc(), Run.id.desc())).label("rank"),
    ).subquery()
    found: dict[int, int] = {}
    for part in chunked(environment_ids):
        found.update((key, value) for key, value in session.execute(
            select(ranked.c.environment_id, func.count())
            .where(ranked.c.rank == 1, ranked.c.environment_id.in_(part))
            .group_by(ranked.c.environment_id)
        ))
    return found
