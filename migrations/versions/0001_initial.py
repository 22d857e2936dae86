"""Initial schema: fleet, runs, content-addressed fingerprints, tokens.

Revision ID: 0001
Revises:
Create Date: 2026-11-21 21:17:15.621287
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# Row ids of the tables that grow with every run (SQLite auto-increments INTEGER only).
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "environments",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("env_key", sa.String(length=64), nullable=False),
        sa.Column("gpu_name", sa.String(length=255), nullable=True),
        sa.Column("compute_capability", sa.String(length=16), nullable=True),
        sa.Column("driver", sa.String(length=64), nullable=True),
        sa.Column("cuda", sa.String(length=64), nullable=True),
        sa.Column("cudnn", sa.String(length=64), nullable=True),
        sa.Column("torch", sa.String(length=64), nullable=True),
        sa.Column("cpu_capability", sa.String(length=64), nullable=True),
        sa.Column("cpu_model", sa.String(length=255), nullable=True),
        sa.Column("document", sa.JSON(), nullable=False),
        sa.Column("first_seen", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_environments")),
        sa.UniqueConstraint("env_key", name=op.f("uq_environments_env_key")),
    )
    op.create_index(op.f("ix_environments_cuda"), "environments", ["cuda"], unique=False)
    op.create_index(op.f("ix_environments_driver"), "environments", ["driver"], unique=False)
    op.create_index(op.f("ix_environments_gpu_name"), "environments", ["gpu_name"], unique=False)
    op.create_index(op.f("ix_environments_torch"), "environments", ["torch"], unique=False)

    op.create_table(
        "fingerprints",
        sa.Column("hash", sa.String(length=64), nullable=False),
        sa.Column("dtype", sa.String(length=32), nullable=False),
        sa.Column("shape", sa.JSON(), nullable=False),
        sa.Column("count", sa.BigInteger(), nullable=True),
        sa.Column("nan", sa.BigInteger(), nullable=True),
        sa.Column("inf", sa.BigInteger(), nullable=True),
        sa.Column("zero", sa.BigInteger(), nullable=True),
        sa.Column("subnormal", sa.BigInteger(), nullable=True),
        sa.Column("fp16_overflow", sa.BigInteger(), nullable=True),
        sa.Column("fp16_underflow", sa.BigInteger(), nullable=True),
        sa.Column("min", sa.Float(), nullable=True),
        sa.Column("max", sa.Float(), nullable=True),
        sa.Column("mean", sa.Float(), nullable=True),
        sa.Column("std", sa.Float(), nullable=True),
        sa.Column("abs_max", sa.Float(), nullable=True),
        sa.Column("l2", sa.Float(), nullable=True),
        sa.Column("sketch", sa.LargeBinary(), nullable=True),
        sa.Column("sketch_dtype", sa.String(length=32), nullable=True),
        sa.Column("sample", sa.LargeBinary(), nullable=True),
        sa.Column("sample_dtype", sa.String(length=32), nullable=True),
        sa.Column("values", sa.LargeBinary(), nullable=True),
        sa.Column("values_dtype", sa.String(length=32), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("hash", name=op.f("pk_fingerprints")),
    )
    op.create_table(
        "manifests",
        sa.Column("hash", sa.String(length=64), nullable=False),
        sa.Column("entries", sa.JSON(), nullable=False),
        sa.Column("tensor_count", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("hash", name=op.f("pk_manifests")),
    )
    op.create_table(
        "nodes",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("first_seen", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_nodes")),
        sa.UniqueConstraint("name", name=op.f("uq_nodes_name")),
    )
    op.create_index(op.f("ix_nodes_last_seen"), "nodes", ["last_seen"], unique=False)

    op.create_table(
        "tokens",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("label", sa.String(length=255), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tokens")),
        sa.UniqueConstraint("sha256", name=op.f("uq_tokens_sha256")),
    )
    op.create_table(
        "runs",
        sa.Column("id", BIG_ID, nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("environment_id", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("agent_version", sa.String(length=64), nullable=True),
        sa.Column("document_sha256", sa.String(length=64), nullable=False),
        sa.Column("drill", sa.Boolean(), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["environment_id"],
            ["environments.id"],
            name=op.f("fk_runs_environment_id_environments"),
        ),
        sa.ForeignKeyConstraint(["node_id"], ["nodes.id"], name=op.f("fk_runs_node_id_nodes")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runs")),
        sa.UniqueConstraint("run_id", name=op.f("uq_runs_run_id")),
    )
    op.create_index(op.f("ix_runs_environment_id"), "runs", ["environment_id"], unique=False)
    op.create_index(op.f("ix_runs_node_id"), "runs", ["node_id"], unique=False)
    op.create_index(op.f("ix_runs_received_at"), "runs", ["received_at"], unique=False)
    op.create_index(op.f("ix_runs_started_at"), "runs", ["started_at"], unique=False)

    op.create_table(
        "outcomes",
        sa.Column("id", BIG_ID, nullable=False),
        sa.Column("hash", sa.String(length=64), nullable=False),
        sa.Column("suite", sa.String(length=64), nullable=False),
        sa.Column("workload", sa.String(length=128), nullable=False),
        sa.Column("workload_version", sa.Integer(), nullable=True),
        sa.Column("variant", sa.String(length=64), nullable=False),
        sa.Column("device", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("input_hash", sa.String(length=128), nullable=True),
        sa.Column("param_hash", sa.String(length=128), nullable=True),
        sa.Column("manifest_hash", sa.String(length=64), nullable=True),
        sa.Column("repeats", sa.Integer(), nullable=True),
        sa.Column("repeats_agree", sa.Boolean(), nullable=True),
        sa.Column("knobs", sa.JSON(), nullable=True),
        sa.ForeignKeyConstraint(
            ["manifest_hash"], ["manifests.hash"], name=op.f("fk_outcomes_manifest_hash_manifests")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_outcomes")),
        sa.UniqueConstraint("hash", name=op.f("uq_outcomes_hash")),
    )
    op.create_index("ix_outcomes_key", "outcomes", ["suite", "workload", "variant"], unique=False)
    op.create_index(op.f("ix_outcomes_manifest_hash"), "outcomes", ["manifest_hash"], unique=False)
    op.create_index(op.f("ix_outcomes_status"), "outcomes", ["status"], unique=False)

    op.create_table(
        "results",
        sa.Column("id", BIG_ID, nullable=False),
        sa.Column("run_id", BIG_ID, nullable=False),
        sa.Column("outcome_id", BIG_ID, nullable=False),
        sa.Column("wall_s", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(
            ["outcome_id"], ["outcomes.id"], name=op.f("fk_results_outcome_id_outcomes")
        ),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_results_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_results")),
    )
    op.create_index(op.f("ix_results_outcome_id"), "results", ["outcome_id"], unique=False)
    op.create_index(op.f("ix_results_run_id"), "results", ["run_id"], unique=False)

    op.create_table(
        "latest",
        sa.Column("id", BIG_ID, nullable=False),
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("suite", sa.String(length=64), nullable=False),
        sa.Column("workload", sa.String(length=128), nullable=False),
        sa.Column("variant", sa.String(length=64), nullable=False),
        sa.Column("result_id", BIG_ID, nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["node_id"], ["nodes.id"], name=op.f("fk_latest_node_id_nodes")),
        sa.ForeignKeyConstraint(
            ["result_id"],
            ["results.id"],
            name=op.f("fk_latest_result_id_results"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_latest")),
        sa.UniqueConstraint(
            "node_id",
            "suite",
            "workload",
            "variant",
            name=op.f("uq_latest_node_id_suite_workload_variant"),
        ),
    )
    op.create_index("ix_latest_key", "latest", ["suite", "workload", "variant"], unique=False)
    op.create_index(op.f("ix_latest_result_id"), "latest", ["result_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_latest_result_id"), table_name="latest")
    op.drop_index("ix_latest_key", table_name="latest")

    op.drop_table("latest")
    op.drop_index(op.f("ix_results_run_id"), table_name="results")
    op.drop_index(op.f("ix_results_outcome_id"), table_name="results")
    op.drop_table("results")
    op.drop_index(op.f("ix_outcomes_status"), table_name="outcomes")
    op.drop_index(op.f("ix_outcomes_manifest_hash"), table_name="outcomes")
    op.drop_index("ix_outcomes_key", table_name="outcomes")
    op.drop_table("outcomes")
    op.drop_index(op.f("ix_runs_started_at"), table_name="runs")
    op.drop_index(op.f("ix_runs_received_at"), table_name="runs")
    op.drop_index(op.f("ix_runs_node_id"), table_name="runs")
    op.drop_index(op.f("ix_runs_environment_id"), table_name="runs")

    op.drop_table("runs")
    op.drop_table("tokens")
    op.drop_index(op.f("ix_nodes_last_seen"), table_name="nodes")

    op.drop_table("nodes")
    op.drop_table("manifests")
    op.drop_table("fingerprints")
    op.drop_index(op.f("ix_environments_torch"), table_name="environments")
    op.drop_index(op.f("ix_environments_gpu_name"), table_name="environments")
    op.drop_index(op.f("ix_environments_driver"), table_name="environments")
    op.drop_index(op.f("ix_environments_cuda"), table_name="environments")

    op.drop_table("environments")
