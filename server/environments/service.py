"""The environment inventory: every env_key seen, its promoted attributes and its nodes."""

from __future__ import annotations

from sqlalchemy.orm import Session

from numparity_server.environments import repository
from numparity_server.environments.schemas import PROMOTED, EnvironmentItem
from numparity_server.kit.pagination import Page


def list_environments(*, session: Session, filters: dict[str, str | None], limit: int,
                      offset: int) -> Page[EnvironmentItem]:
    """Environments in order of first appearance, optionally filtered on promoted columns."""
    wanted = {column: value for column, value in filters.items()
              if value is not None and column in PROMOTED}
    total = repository.count_environments(session, wanted)
    rows = repository.environments_page(session, wanted, limit=limit, offset=offset)
    ids = [row.id for row in rows]
    usage = repository.usage(session, ids)
    current = repository.current_nodes(session, ids)
    items = [
        EnvironmentItem(
            env_key=row.env_key, first_seen=row.first_seen,
            **{column: getattr(row, column) for column in PROMOTED},
            nodes=usage.get(row.id, (0, 0))[0], runs=usage.get(row.id, (0, 0))[1],
            current_nodes=current.get(row.id, 0),
        )
        for row in rows
    ]
    return Page[EnvironmentItem](items=items, total=total, limit=limit, offset=offset)
