"""device owners and claims.

A physical device (UUID, else serial) belongs to the node that reported it first
(design §3.1): ``devices.owner_node_id``. Another node's report of it is kept on a device
row of that node, ``claim_of`` the owned one, until an admin confirms the move
(``numparity-server device move``). Stored devices are owned by the node they sit on
(those no node holds stay unowned: the next node to report one owns it); the downgrade
drops both columns, and claims with them become devices of their own of the claiming
node (their results stay).

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-27 06:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("devices") as batch:
        batch.add_column(sa.Column("owner_node_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("claim_of", sa.Integer(), nullable=True))
        batch.create_foreign_key(op.f("fk_devices_owner_node_id_nodes"), "nodes",
                                 ["owner_node_id"], ["id"])
        batch.create_foreign_key(op.f("fk_devices_claim_of_devices"), "devices",
                                 ["claim_of"], ["id"])
        batch.create_index(op.f("ix_devices_owner_node_id"), ["owner_node_id"])
        batch.create_index(op.f("ix_devices_claim_of"), ["claim_of"])
    op.execute("UPDATE devices SET owner_node_id = node_id")


def downgrade() -> None:
    with op.batch_alter_table("devices") as batch:
        batch.drop_index(op.f("ix_devices_claim_of"))
        batch.drop_index(op.f("ix_devices_owner_node_id"))
        batch.drop_constraint(op.f("fk_devices_claim_of_devices"), type_="foreignkey")
        batch.drop_constraint(op.f("fk_devices_owner_node_id_nodes"), type_="foreignkey")
        batch.drop_column("claim_of")
        batch.drop_column("owner_node_id")
