"""latest carries its result's outcome, environment and wall time (for the analysis).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22 00:45:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("latest") as batch:
        batch.add_column(sa.Column("outcome_id", BIG_ID, nullable=True))
        batch.add_column(sa.Column("environment_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("wall_s", sa.Float(), nullable=True))
    # Fill the copies from the results the rows point at (portable correlated updates).
    op.execute(
        "UPDATE latest SET "
        "outcome_id = (SELECT results.outcome_id FROM results "
        "WHERE results.id = latest.result_id), "
        "wall_s = (SELECT results.wall_s FROM results WHERE results.id = latest.result_id), "
        "environment_id = (SELECT runs.environment_id FROM results "
        "JOIN runs ON runs.id = results.run_id WHERE results.id = latest.result_id)"
    )
    with op.batch_alter_table("latest") as batch:
        batch.alter_column("outcome_id", existing_type=BIG_ID, nullable=False)
        batch.alter_column("environment_id", existing_type=sa.Integer(), nullable=False)
        batch.create_foreign_key(op.f("fk_latest_environment_id_environments"),
                                 "environments", ["environment_id"], ["id"])


def downgrade() -> None:
    with op.batch_alter_table("latest") as batch:
        batch.drop_constraint(op.f("fk_latest_environment_id_environments"),
                              type_="foreignkey")
        batch.drop_column("wall_s")
        batch.drop_column("environment_id")
        batch.drop_column("outcome_id")
