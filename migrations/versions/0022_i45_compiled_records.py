"""explanations.target, results.compiled.

What an `explain` finding's reference is (design §2.11, §2.14, issue 45): "run", the
bits of another run's result, as every finding so far; or "eager", a compiled result
that gives the same run's eager (default) answer under an Inductor setting. Stored rows
are findings of the first kind: the column is added NOT NULL with "run" as the server
default; the downgrade drops it (and with it what eager findings there are: they would
read as findings against the run's compiled bits).

A compiled result's record (design §2.14): its compile passes (seconds, Inductor's cache
hits and misses, graphs; cold and warm) and where it parts from eager (the module, its
kernels, or fusion across modules). One nullable JSON column on results, new: stored
rows are untouched (NULL: none recorded); the downgrade drops it.

Revision ID: 0022
Revises: 0021
Create Date: 2026-11-29 01:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("explanations") as batch:
        batch.add_column(sa.Column("target", sa.String(16), nullable=False,
                                   server_default="run"))
    with op.batch_alter_table("results") as batch:
        batch.add_column(sa.Column("compiled", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("results") as batch:
        batch.drop_column("compiled")
    op.execute("DELETE FROM explanations WHERE target <> 'run'")
    with op.batch_alter_table("explanations") as batch:
        batch.drop_column("target")
