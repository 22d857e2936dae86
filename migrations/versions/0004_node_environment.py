"""nodes: the environment of the newest run, and when the node changed environment.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22 01:20:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("environment_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("newest_started_at", sa.DateTime(timezone=True),
                                   nullable=True))
        batch.add_column(sa.Column("environment_changed_at", sa.DateTime(timezone=True),
                                   nullable=True))
        batch.create_foreign_key(op.f("fk_nodes_environment_id_environments"),
                                 "environments", ["environment_id"], ["id"])
        batch.create_index(op.f("ix_nodes_environment_changed_at"),
                           ["environment_changed_at"], unique=False)
    # From the runs already stored: the newest run's environment; a node that ran on
    # more than one environment is marked as changed at its newest run (drift then
    # reads its runs and finds where).
    op.execute(
        "UPDATE nodes SET "
        "newest_started_at = (SELECT max(runs.started_at) FROM runs "
        "WHERE runs.node_id = nodes.id), "
        "environment_id = (SELECT runs.environment_id FROM runs WHERE runs.node_id = nodes.id "
        "ORDER BY runs.started_at DESC, runs.id DESC LIMIT 1)"
    )
    op.execute(
        "UPDATE nodes SET environment_changed_at = newest_started_at "
        "WHERE (SELECT count(DISTINCT runs.environment_id) FROM runs "
        "WHERE runs.node_id = nodes.id) > 1"
    )


def downgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.drop_index(op.f("ix_nodes_environment_changed_at"))
        batch.drop_constraint(op.f("fk_nodes_environment_id_environments"), type_="foreignkey")
        batch.drop_column("environment_changed_at")
        batch.drop_column("newest_started_at")
        batch.drop_column("environment_id")
