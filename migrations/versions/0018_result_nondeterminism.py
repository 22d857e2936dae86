"""results.nondeterminism.

A result whose repeats disagree carries, from a traced agent, the ops whose outputs
differed on the same inputs and the cost study of making only them deterministic
(design §2.13). Timings, so on the result beside ``wall_s``, not on its outcome. One
nullable JSON column, new: stored rows are untouched; the downgrade drops it.

Down revision: 0016 on this branch; 0017 (device owners) is written beside it, and the
merge re-points this revision to 0017.

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-27 06:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("results") as batch:
        batch.add_column(sa.Column("nondeterminism", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("results") as batch:
        batch.drop_column("nondeterminism")
