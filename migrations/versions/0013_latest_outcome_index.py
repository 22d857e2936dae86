"""latest: an index on outcome_id, so /audit finds the holders of a few outcomes.

The audit asks which nodes hold a handful of outcomes (a deviant strict answer, the
answers of a nondeterministic key); without an index that is a scan of every latest row
(11.9 s at 100,000 nodes on PostgreSQL). The index does not cost uploads their HOT
updates (0003): PostgreSQL keeps an update HOT when no indexed column's value changes,
comparing the old and new values, not the columns the UPDATE names. An upload's
``outcome_id`` differs from the row's only when the node's answer for that key changed
(an outcome is everything a result says but its timing, content-addressed), so a node
that keeps its answers updates its latest rows in place as before; only the keys whose
answer changed write an index entry. Checked on PostgreSQL 15: upserts that set
``outcome_id`` to its own value were HOT, those that changed it were not.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-29 09:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_latest_outcome_id", "latest", ["outcome_id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_latest_outcome_id", table_name="latest")
