"""explanations.

What `numparity-agent explain` found: one row per finding, the setting under which a node
gives a reference run's bits (or the closest), against that run (dropped with it) and
the node's environment at the time. A new table: stored rows are untouched, and the
downgrade drops the findings (the older schema has nowhere to keep them).

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26 12:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "explanations",
        sa.Column("id", BIG_ID, nullable=False),
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("environment_id", sa.Integer(), nullable=True),
        sa.Column("against_run_pk", BIG_ID, nullable=False),
        sa.Column("against_node_id", sa.Integer(), nullable=False),
        sa.Column("suite", sa.String(length=64), nullable=False),
        sa.Column("workload", sa.String(length=128), nullable=False),
        sa.Column("workload_version", sa.Integer(), nullable=True),
        sa.Column("variant", sa.String(length=64), nullable=False),
        sa.Column("device", sa.String(length=64), nullable=False),
        sa.Column("local_device", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("label", sa.Text(), nullable=True),
        sa.Column("setting", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("closest", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.Column("tried", sa.Integer(), nullable=False),
        sa.Column("seconds", sa.Float(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["node_id"], ["nodes.id"],
                                name=op.f("fk_explanations_node_id_nodes")),
        sa.ForeignKeyConstraint(["environment_id"], ["environments.id"],
                                name=op.f("fk_explanations_environment_id_environments")),
        sa.ForeignKeyConstraint(["against_run_pk"], ["runs.id"],
                                name=op.f("fk_explanations_against_run_pk_runs"),
                                ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["against_node_id"], ["nodes.id"],
                                name=op.f("fk_explanations_against_node_id_nodes")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_explanations")),
    )
    op.create_index("ix_explanations_key", "explanations", ["suite", "workload", "variant"],
                    unique=False)
    op.create_index(op.f("ix_explanations_node_id"), "explanations", ["node_id"],
                    unique=False)
    op.create_index(op.f("ix_explanations_against_run_pk"), "explanations",
                    ["against_run_pk"], unique=False)
    op.create_index(op.f("ix_explanations_against_node_id"), "explanations",
                    ["against_node_id"], unique=False)
    op.create_index(op.f("ix_explanations_created_at"), "explanations", ["created_at"],
                    unique=False)


def downgrade() -> None:
    op.drop_table("explanations")
