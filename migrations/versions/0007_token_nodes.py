"""tokens.node_names, tokens.node_patterns: an agent token bound to the nodes it writes.

Both NULL (every token before this revision): an unbound token, which writes runs of any
node. The downgrade revokes every bound token that is still live: the older schema has
nowhere to keep its binding, and without it the token would write runs of any node.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25 03:00:00
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("tokens") as batch:
        batch.add_column(sa.Column("node_names", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("node_patterns", sa.JSON(), nullable=True))


def downgrade() -> None:
    tokens = sa.table("tokens", sa.column("revoked_at", sa.DateTime(timezone=True)),
                      sa.column("node_names", sa.JSON()),
                      sa.column("node_patterns", sa.JSON()))
    now = datetime.now(timezone.utc)
    if op.get_bind().dialect.name == "sqlite":
        now = now.replace(tzinfo=None)  # stored naive UTC there (models.base.UTCDateTime)
    op.execute(tokens.update()
               .where(tokens.c.revoked_at.is_(None))
               .where(tokens.c.node_names.isnot(None) | tokens.c.node_patterns.isnot(None))
               .values(revoked_at=now))
    with op.batch_alter_table("tokens") as batch:
        batch.drop_column("node_patterns")
        batch.drop_column("node_names")
