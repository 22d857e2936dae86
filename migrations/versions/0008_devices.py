"""devices; results.device_id; latest per (node, device, suite, workload, variant).

Each device a node runs the suite on gets a row: a GPU known by its UUID (or serial)
wherever it sits, or a node's CPU. Runs stored before this revision have no device
description, so each (node, device string) they used becomes a device of that node by
its slot (``node:<node id>/<slot>``, model = the device type), and their results and
latest rows point at it. The downgrade keeps, per (node, suite, workload, variant), the
newest latest row (what the older schema held: one device per node and key).

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25 07:00:00
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_runs = sa.table("runs", sa.column("id"), sa.column("node_id"))
_outcomes = sa.table("outcomes", sa.column("id"), sa.column("device"))
_results = sa.table("results", sa.column("id"), sa.column("run_pk"), sa.column("outcome_id"),
                    sa.column("device_id"))
_latest = sa.table("latest", sa.column("id"), sa.column("node_id"), sa.column("result_id"),
                   sa.column("device_id"), sa.column("suite"), sa.column("workload"),
                   sa.column("variant"), sa.column("started_at"))
_devices = sa.table("devices", sa.column("id"), sa.column("identity"), sa.column("type"),
                    sa.column("model"), sa.column("mig"), sa.column("node_id"),
                    sa.column("slot"), sa.column("first_seen"), sa.column("last_seen"))


def _now() -> datetime:
    now = datetime.now(timezone.utc)
    if op.get_bind().dialect.name == "sqlite":
        now = now.replace(tzinfo=None)  # stored naive UTC there (models.base.UTCDateTime)
    return now


def upgrade() -> None:
    op.create_table(
        "devices",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("identity", sa.String(length=320), nullable=False),
        sa.Column("type", sa.String(length=16), nullable=False),
        sa.Column("model", sa.String(length=320), nullable=False),
        sa.Column("uuid", sa.String(length=128), nullable=True),
        sa.Column("serial", sa.String(length=128), nullable=True),
        sa.Column("pci_bus_id", sa.String(length=64), nullable=True),
        sa.Column("name", sa.String(length=255), nullable=True),
        sa.Column("compute_capability", sa.String(length=16), nullable=True),
        sa.Column("mig", sa.Boolean(), nullable=False),
        sa.Column("node_id", sa.Integer(), nullable=True),
        sa.Column("slot", sa.String(length=64), nullable=False),
        sa.Column("first_seen", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen", sa.DateTime(timezone=True), nullable=False),
        sa.Column("newest_started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("moved_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["node_id"], ["nodes.id"], name=op.f("fk_devices_node_id_nodes")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_devices")),
        sa.UniqueConstraint("identity", name=op.f("uq_devices_identity")),
    )
    op.create_index(op.f("ix_devices_moved_at"), "devices", ["moved_at"], unique=False)
    op.create_index(op.f("ix_devices_node_id"), "devices", ["node_id"], unique=False)
    op.create_index(op.f("ix_devices_serial"), "devices", ["serial"], unique=False)
    op.create_index(op.f("ix_devices_uuid"), "devices", ["uuid"], unique=False)
    with op.batch_alter_table("results") as batch:
        batch.add_column(sa.Column("device_id", sa.Integer(), nullable=True))
        batch.create_foreign_key(op.f("fk_results_device_id_devices"), "devices",
                                 ["device_id"], ["id"])
    op.create_index(op.f("ix_results_device_id"), "results", ["device_id"], unique=False)
    with op.batch_alter_table("latest") as batch:
        batch.add_column(sa.Column("device_id", sa.Integer(), nullable=True))

    # Every (node, device string) stored runs used becomes a device of that node.
    bind = op.get_bind()
    used = bind.execute(
        sa.select(_runs.c.node_id, _outcomes.c.device).distinct()
        .select_from(_results)
        .join(_runs, _runs.c.id == _results.c.run_pk)
        .join(_outcomes, _outcomes.c.id == _results.c.outcome_id)
    ).all()
    now = _now()
    rows = []
    for node_id, slot in used:
        kind = (slot or "").partition(":")[0] or "unknown"
        rows.append({"identity": f"node:{node_id}/{slot or ''}", "type": kind[:16],
                     "model": kind[:16], "mig": False, "node_id": node_id,
                     "slot": slot or "", "first_seen": now, "last_seen": now})
    if rows:
        op.bulk_insert(_devices, rows)
    identity = (sa.literal("node:") + sa.cast(_runs.c.node_id, sa.String)
                + sa.literal("/") + _outcomes.c.device)
    op.execute(_results.update().values(device_id=(
        sa.select(_devices.c.id)
        .select_from(_runs.join(_outcomes, sa.true()).join(
            _devices, _devices.c.identity == identity))
        .where(_runs.c.id == _results.c.run_pk, _outcomes.c.id == _results.c.outcome_id)
        .scalar_subquery())))
    op.execute(_latest.update().values(device_id=(
        sa.select(_results.c.device_id).where(_results.c.id == _latest.c.result_id)
        .scalar_subquery())))
    with op.batch_alter_table("latest") as batch:
        batch.alter_column("device_id", existing_type=sa.Integer(), nullable=False)
        batch.create_foreign_key(op.f("fk_latest_device_id_devices"), "devices",
                                 ["device_id"], ["id"])
        batch.drop_constraint(op.f("uq_latest_node_id_suite_workload_variant"), type_="unique")
        batch.create_unique_constraint(
            op.f("uq_latest_node_id_device_id_suite_workload_variant"),
            ["node_id", "device_id", "suite", "workload", "variant"])


def downgrade() -> None:
    # One latest row per (node, suite, workload, variant): the newest, then the largest id.
    newer = sa.alias(_latest, "newer")
    op.execute(_latest.delete().where(sa.exists(
        sa.select(newer.c.id).where(
            newer.c.node_id == _latest.c.node_id, newer.c.suite == _latest.c.suite,
            newer.c.workload == _latest.c.workload, newer.c.variant == _latest.c.variant,
            (newer.c.started_at > _latest.c.started_at)
            | ((newer.c.started_at == _latest.c.started_at) & (newer.c.id > _latest.c.id))))))
    with op.batch_alter_table("latest") as batch:
        batch.drop_constraint(op.f("uq_latest_node_id_device_id_suite_workload_variant"),
                              type_="unique")
        batch.drop_constraint(op.f("fk_latest_device_id_devices"), type_="foreignkey")
        batch.drop_column("device_id")
        batch.create_unique_constraint(op.f("uq_latest_node_id_suite_workload_variant"),
                                       ["node_id", "suite", "workload", "variant"])
    op.drop_index(op.f("ix_results_device_id"), table_name="results")
    with op.batch_alter_table("results") as batch:
        batch.drop_constraint(op.f("fk_results_device_id_devices"), type_="foreignkey")
        batch.drop_column("device_id")
    op.drop_index(op.f("ix_devices_uuid"), table_name="devices")
    op.drop_index(op.f("ix_devices_serial"), table_name="devices")
    op.drop_index(op.f("ix_devices_node_id"), table_name="devices")
    op.drop_index(op.f("ix_devices_moved_at"), table_name="devices")
    op.drop_table("devices")
