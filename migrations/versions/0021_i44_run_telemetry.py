"""runs.telemetry.

The GPUs' NVML readings (temperature, clocks, power, ECC and remapped-row counters) at
a run's start and end, by slot (design §2.7, issue 44), shown beside a suspect's
disagreements on its node's page. One nullable JSON column, new: stored rows are
untouched (NULL: none recorded); the downgrade drops it.

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-28 22:10:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("telemetry", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("telemetry")
