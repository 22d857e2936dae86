"""Alembic: an empty database upgrades to head and back, and models match migrations."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from numparity_server.kit import migrate
from numparity_server.kit.db import create_engine_for
from numparity_server.models import Base

TABLES = {"nodes", "environments", "runs", "results", "manifests", "fingerprints", "latest",
          "tokens"}


def test_upgrade_to_head_and_back_down(database_url):
    engine = create_engine_for(database_url, pooled=False)
    try:
        migrate.upgrade(database_url)
        with engine.connect() as connection:
            assert migrate.current_revision(connection) == migrate.head_revision()
            assert TABLES <= set(inspect(connection).get_table_names())
        migrate.downgrade(database_url, "base")
        with engine.connect() as connection:
            assert migrate.current_revision(connection) is None
            assert not TABLES & set(inspect(connection).get_table_names())
        migrate.upgrade(database_url)  # and up again, from a downgraded database
    finally:
        engine.dispose()


def test_models_and_migrations_describe_the_same_schema(migrated_database_url):
    engine = create_engine_for(migrated_database_url, pooled=False)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={"compare_type": True})
            assert compare_metadata(context, Base.metadata) == []
    finally:
        engine.dispose()


def test_every_lookup_column_is_indexed(migrated_database_url):
    engine = create_engine_for(migrated_database_url, pooled=False)
    try:
        inspector = inspect(engine)
        def indexed(table: str) -> set[tuple[str, ...]]:
            found = {tuple(ix["column_names"]) for ix in inspector.get_indexes(table)}
            found |= {tuple(uq["column_names"]) for uq in inspector.get_unique_constraints(table)}
            return found
        assert ("suite", "workload", "variant") in indexed("outcomes")
        assert ("hash",) in indexed("outcomes")
        assert ("run_id",) in indexed("results") and ("outcome_id",) in indexed("results")
        assert ("suite", "workload", "variant") in indexed("latest")
        assert ("node_id", "suite", "workload", "variant") in indexed("latest")
        assert ("manifest_hash",) in indexed("outcomes")
        assert ("run_id",) in indexed("runs") and ("env_key",) in indexed("environments")
        assert ("sha256",) in indexed("tokens")
    finally:
        engine.dispose()
