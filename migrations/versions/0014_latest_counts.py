"""latest_counts: ``latest`` counted by (environment, outcome, device model), kept by ingest.

The fleet-wide reads (the audit, /metrics, the dashboard's pages, /divergence's groups)
each grouped every ``latest`` row: 36 rows a node, 3.6 million at 100,000 nodes, seconds
on PostgreSQL whatever the indexes. They read these counts instead: a row per distinct
answer of an environment on a device model, a few hundred for a lab. Ingest moves the
counts in the transaction that moves the latest rows (``runs.counts``).

``latest.model`` is the device's model when the result ran, so the counts are a function
of ``latest`` alone (a device's description can change after its latest results were
stored). Both are filled from what is there.

``latest``'s index on ``outcome_id`` (0013) takes ``environment_id`` too: the audit asks
who holds an answer in one environment, and an answer (a CPU's, say) is often shared by
environments of tens of thousands of nodes.

On PostgreSQL ``results.outcome_id`` keeps statistics of a thousand values, and
``nodes.name`` takes the "C" collation (code point order, as Python and
SQLite compare): "the first nodes by name" then walks the unique index.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-26 02:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

# The counts as ``runs.counts.rebuild`` computes them (the same statement, written here so
# a revision never changes with the application's code).
FILL = """
INSERT INTO latest_counts (environment_id, outcome_id, model, suite, workload, variant,
                           devices, first_node, wall_sum, wall_sq_sum, walls, spread_sum,
                           spreads)
SELECT latest.environment_id, latest.outcome_id, latest.model, latest.suite,
       latest.workload, latest.variant, count(*), min(nodes.name{collate}),
       coalesce(sum(latest.wall_s), 0), coalesce(sum(latest.wall_s * latest.wall_s), 0),
       count(latest.wall_s), coalesce(sum(latest.wall_s_spread), 0),
       count(latest.wall_s_spread)
FROM latest JOIN nodes ON nodes.id = latest.node_id
GROUP BY latest.environment_id, latest.outcome_id, latest.model, latest.suite,
         latest.workload, latest.variant
"""


def upgrade() -> None:
    postgresql = op.get_bind().dialect.name == "postgresql"
    with op.batch_alter_table("latest") as batch:
        batch.add_column(sa.Column("model", sa.String(length=320), nullable=True))
    op.execute("UPDATE latest SET model = coalesce("
               "(SELECT devices.model FROM devices WHERE devices.id = latest.device_id), 'cpu')")
    with op.batch_alter_table("latest") as batch:
        batch.alter_column("model", existing_type=sa.String(length=320), nullable=False)
    op.create_table(
        "latest_counts",
        sa.Column("id", BIG_ID, nullable=False),
        sa.Column("environment_id", sa.Integer(), nullable=False),
        sa.Column("outcome_id", BIG_ID, nullable=False),
        sa.Column("model", sa.String(length=320), nullable=False),
        sa.Column("suite", sa.String(length=64), nullable=False),
        sa.Column("workload", sa.String(length=128), nullable=False),
        sa.Column("variant", sa.String(length=64), nullable=False),
        sa.Column("devices", sa.Integer(), nullable=False),
        sa.Column("first_node", sa.String(length=255), nullable=True),
        sa.Column("wall_sum", sa.Float(), nullable=False),
        sa.Column("wall_sq_sum", sa.Float(), nullable=False),
        sa.Column("walls", sa.Integer(), nullable=False),
        sa.Column("spread_sum", sa.Float(), nullable=False),
        sa.Column("spreads", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["environment_id"], ["environments.id"],
                                name=op.f("fk_latest_counts_environment_id_environments")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_latest_counts")),
        sa.UniqueConstraint("environment_id", "outcome_id", "model",
                            name=op.f("uq_latest_counts_environment_id_outcome_id_model")),
    )
    op.create_index("ix_latest_counts_key", "latest_counts", ["suite", "workload", "variant"],
                    unique=False)
    # "Who holds this answer in that environment": an outcome (a CPU answer, say) is
    # shared by environments, and the audit asks for its holders in one of them.
    op.drop_index("ix_latest_outcome_id", table_name="latest")
    op.create_index("ix_latest_outcome_id_environment_id", "latest",
                    ["outcome_id", "environment_id"], unique=False)
    if postgresql:
        # Statistics of a thousand outcomes: the audit looks up the results of a few
        # hundred rare (unusual) outcomes, which the default hundred estimated at the
        # average outcome's thousands of results each, and scanned every result
        # (220 ms at 100,000 nodes; 33 ms through the index).
        op.execute("ALTER TABLE results ALTER COLUMN outcome_id SET STATISTICS 1000")
        # Names in code point order, as Python and SQLite compare them: the unique index
        # then walks nodes in the order the analysis names them.
        op.alter_column("nodes", "name", type_=sa.String(length=255, collation="C"),
                        existing_type=sa.String(length=255), existing_nullable=False)
    op.execute(FILL.format(collate=' COLLATE "C"' if postgresql else ""))


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE results ALTER COLUMN outcome_id SET STATISTICS -1")
        op.alter_column("nodes", "name", type_=sa.String(length=255),
                        existing_type=sa.String(length=255, collation="C"),
                        existing_nullable=False)
    op.drop_index("ix_latest_outcome_id_environment_id", table_name="latest")
    op.create_index("ix_latest_outcome_id", "latest", ["outcome_id"], unique=False)
    op.drop_index("ix_latest_counts_key", table_name="latest_counts")
    op.drop_table("latest_counts")
    with op.batch_alter_table("latest") as batch:
        batch.drop_column("model")
