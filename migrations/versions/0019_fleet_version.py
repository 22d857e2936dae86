"""fleet_version.

The fleet's version (``models.fleet_version``): one row, whose counter every write the
fleet-wide reads depend on advances in its own transaction, so the read cache keys on
commits rather than on the newest run id (handed out at insert, not at commit). A new
table with its row at 0: stored rows are untouched; the downgrade drops it (the cache
then keys on nothing kept in the database: processes restart on a downgrade anyway).

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-28 19:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    table = op.create_table(
        "fleet_version",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_fleet_version")),
    )
    op.bulk_insert(table, [{"id": 1, "version": 0}])


def downgrade() -> None:
    op.drop_table("fleet_version")
