"""comparisons.

What /divergence computed, kept by content: a comparison of two distinct answers (or
two representatives' origin ops, or a group's fp64 judgement) under the sha256 of
everything it read, so a repeated question costs a look-up. A new table: stored rows
are untouched; the downgrade drops it (every comparison can be computed again).

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-27 12:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "comparisons",
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=8), nullable=False),
        sa.Column("hash_a", sa.String(length=64), nullable=False),
        sa.Column("hash_b", sa.String(length=64), nullable=False),
        sa.Column("value", sa.JSON(), nullable=False),
        sa.Column("awaiting", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_comparisons")),
    )
    op.create_index(op.f("ix_comparisons_created_at"), "comparisons", ["created_at"],
                    unique=False)


def downgrade() -> None:
    op.drop_table("comparisons")
