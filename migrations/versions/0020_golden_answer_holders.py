"""golden_answers.held_by.

A pin taken from the fleet's majority says who held each answer: the first holder
nodes by name (design §3.11); ``holders`` and ``devices`` count nodes for such a pin
from now on. One nullable JSON column, new: stored rows are untouched (NULL: not
recorded); the downgrade drops it.

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-28 19:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("golden_answers") as batch:
        batch.add_column(sa.Column("held_by", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("golden_answers") as batch:
        batch.drop_column("held_by")
