"""fingerprints: +Inf and -Inf counted apart; full values of large tensors, compressed.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24 22:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("fingerprints") as batch:
        batch.add_column(sa.Column("pos_inf", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("neg_inf", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("values_codec", sa.String(length=16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("fingerprints") as batch:
        batch.drop_column("values_codec")
        batch.drop_column("neg_inf")
        batch.drop_column("pos_inf")
