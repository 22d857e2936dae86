"""goldens.

Pinned answers (design §3.11): ``goldens``, a row per version of a pin (who, when, why,
from what), and ``golden_answers``, its answers (a manifest per workload and variant; the
manifest a foreign key, so retention keeps it). New tables: stored rows are untouched;
the downgrade drops the pins.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-27 09:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "goldens",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("subject", sa.String(length=64), nullable=False),
        sa.Column("suite", sa.String(length=64), nullable=False),
        sa.Column("model", sa.String(length=320), nullable=False),
        sa.Column("scope", sa.JSON(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("retired", sa.Boolean(), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("source_run_id", sa.String(length=64), nullable=True),
        sa.Column("source_device", sa.String(length=64), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("pinned_by", sa.String(length=255), nullable=False),
        sa.Column("pinned_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_goldens")),
        sa.UniqueConstraint("subject", "version", name=op.f("uq_goldens_subject_version")),
    )
    op.create_index(op.f("ix_goldens_subject"), "goldens", ["subject"], unique=False)
    op.create_table(
        "golden_answers",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("golden_id", sa.Integer(), nullable=False),
        sa.Column("workload", sa.String(length=128), nullable=False),
        sa.Column("workload_version", sa.Integer(), nullable=True),
        sa.Column("variant", sa.String(length=64), nullable=False),
        sa.Column("manifest_hash", sa.String(length=64), nullable=False),
        sa.Column("input_hash", sa.String(length=64), nullable=True),
        sa.Column("param_hash", sa.String(length=64), nullable=True),
        sa.Column("holders", sa.Integer(), nullable=False),
        sa.Column("devices", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["golden_id"], ["goldens.id"],
                                name=op.f("fk_golden_answers_golden_id_goldens"),
                                ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["manifest_hash"], ["manifests.hash"],
                                name=op.f("fk_golden_answers_manifest_hash_manifests")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_golden_answers")),
        sa.UniqueConstraint("golden_id", "workload", "variant",
                            name=op.f("uq_golden_answers_golden_id_workload_variant")),
    )
    op.create_index(op.f("ix_golden_answers_manifest_hash"), "golden_answers",
                    ["manifest_hash"], unique=False)


def downgrade() -> None:
    op.drop_table("golden_answers")
    op.drop_table("goldens")
