"""results.run_id → results.run_pk: the run's integer key, not the agent's run UUID.

``runs.run_id`` is the agent's UUID (a string); ``results.run_id`` was the integer key of
that run, and code read ``rows[0]["run_id"]`` meaning either. The column, its index and its
foreign key are renamed; no value changes.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-25 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _rename(old: str, new: str) -> None:
    if op.get_bind().dialect.name == "postgresql":
        # In place: no table rewrite, whatever the table's size.
        op.alter_column("results", old, new_column_name=new)
        op.execute(f"ALTER INDEX ix_results_{old} RENAME TO ix_results_{new}")
        op.execute(f"ALTER TABLE results RENAME CONSTRAINT fk_results_{old}_runs "
                   f"TO fk_results_{new}_runs")
        return
    # SQLite renames the column in place (3.25+) but cannot rename an index or a
    # constraint: the index is made anew and the table copied for the foreign key's name.
    op.drop_index(f"ix_results_{old}", table_name="results")
    op.execute(f"ALTER TABLE results RENAME COLUMN {old} TO {new}")
    with op.batch_alter_table("results", recreate="always") as batch:
        batch.drop_constraint(f"fk_results_{old}_runs", type_="foreignkey")
        batch.create_foreign_key(f"fk_results_{new}_runs", "runs", [new], ["id"],
                                 ondelete="CASCADE")
    op.create_index(f"ix_results_{new}", "results", [new])

def upgrade() -> None:
    _rename("run_id", "run_pk")


def downgrade() -> None:
    _rename("run_pk", "run_id")
