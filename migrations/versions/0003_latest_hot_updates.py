"""latest: no foreign key or index on result_id, fillfactor 70 (HOT updates on PostgreSQL).

Every upload moves the result_id of ~36 latest rows. With result_id indexed, each of
those updates wrote new entries into every index of the table and left the old ones
for vacuum; without it PostgreSQL updates the rows in place on their page (HOT).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22 01:05:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.drop_index(op.f("ix_latest_result_id"), table_name="latest")
    with op.batch_alter_table("latest") as batch:
        batch.drop_constraint(op.f("fk_latest_result_id_results"), type_="foreignkey")
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE latest SET (fillfactor = 70)")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE latest RESET (fillfactor)")
    with op.batch_alter_table("latest") as batch:
        batch.create_foreign_key(op.f("fk_latest_result_id_results"), "results",
                                 ["result_id"], ["id"], ondelete="CASCADE")
    op.create_index(op.f("ix_latest_result_id"), "latest", ["result_id"], unique=False)
