"""upload_parts: the parts of uploads too large for one request body.

An agent whose run document or large tensor's values would pass the server's body limit
sends them in parts (design §3.2, "uploads in parts"); each part is a row here until the
upload is complete, checked against its name and stored where it belongs. A new table:
nothing stored changes; the downgrade drops it (and any unfinished upload with it).

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-30 09:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "upload_parts",
        sa.Column("id", BIG_ID, primary_key=True),
        sa.Column("token_id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("offset", sa.BigInteger(), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("total", sa.BigInteger(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_upload_parts"),
        sa.UniqueConstraint("token_id", "kind", "digest", "offset",
                            name="uq_upload_parts_token_id_kind_digest_offset"),
    )
    op.create_index("ix_upload_parts_received_at", "upload_parts", ["received_at"])


def downgrade() -> None:
    op.drop_index("ix_upload_parts_received_at", table_name="upload_parts")
    op.drop_table("upload_parts")
