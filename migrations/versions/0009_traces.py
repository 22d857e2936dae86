"""traces; outcomes.trace_hash.

A traced result's op trace (every aten operation of the run, its tensors named by hash)
is stored once per hash, like manifests, and its outcome points at it. Outcomes stored
before have no trace (NULL), and keep their hashes: the outcome hash covers the trace
only when there is one. The downgrade drops every trace (the older schema has nowhere
to keep them); the outcomes that pointed at one keep everything else.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26 09:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "traces",
        sa.Column("hash", sa.String(length=64), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.Column("op_count", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("hash", name=op.f("pk_traces")),
    )
    with op.batch_alter_table("outcomes") as batch:
        batch.add_column(sa.Column("trace_hash", sa.String(length=64), nullable=True))
        batch.create_foreign_key(op.f("fk_outcomes_trace_hash_traces"), "traces",
                                 ["trace_hash"], ["hash"])
    op.create_index(op.f("ix_outcomes_trace_hash"), "outcomes", ["trace_hash"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_outcomes_trace_hash"), table_name="outcomes")
    with op.batch_alter_table("outcomes") as batch:
        batch.drop_constraint(op.f("fk_outcomes_trace_hash_traces"), type_="foreignkey")
        batch.drop_column("trace_hash")
    op.drop_table("traces")
