"""outcomes.checks; results.wall_s_spread and its latest copy.

A result's self-consistency checks (decoder's decode = prefill, batch invariance and
SDPA backends against math; the invariance probe's batch invariance: design §2.2) are
part of what it says, so they live on its outcome; the outcome hash covers them only
when there are some, so outcomes stored before kept their hashes. A result's
``wall_s_spread`` (half the range of its timed repeats) is timing, so it lives beside
``wall_s`` on the result and its copy in ``latest``. All three columns are nullable and
new: stored rows are untouched; the downgrade drops them.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-28 09:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("outcomes") as batch:
        batch.add_column(sa.Column("checks", sa.JSON(), nullable=True))
    for table in ("results", "latest"):
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("wall_s_spread", sa.Float(), nullable=True))


def downgrade() -> None:
    for table in ("latest", "results"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("wall_s_spread")
    with op.batch_alter_table("outcomes") as batch:
        batch.drop_column("checks")
