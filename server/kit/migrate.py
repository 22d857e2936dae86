"""Alembic, driven from code: no alembic.ini, the scripts ship in the server package."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, func, select

import numparity_server.migrations as migrations_package
from numparity_server.kit.db import WRITE_OPTION, create_engine_for, normalize_url
from numparity_server.kit.settings import Settings

SCRIPT_LOCATION = Path(migrations_package.__file__).resolve().parent


def alembic_config(database_url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(SCRIPT_LOCATION))
    # ConfigParser interpolates "%": a password with "%" in it must be escaped.
    url = normalize_url(database_url).render_as_string(hide_password=False)
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


# The key of the PostgreSQL advisory lock migrations take (any constant: "numparity"
# in ASCII, as a bigint).
MIGRATION_LOCK_KEY = 0x6E756D7061726974


def upgrade(database_url: str, revision: str = "head") -> None:
    """Upgrade to ``revision``, one migration at a time (``_one_at_a_time``)."""
    with _one_at_a_time(database_url) as config:
        command.upgrade(config, revision)


def downgrade(database_url: str, revision: str = "base") -> None:
    with _one_at_a_time(database_url) as config:
        command.downgrade(config, revision)


# How long a migration waits for another on SQLite (ms): a migration's time, not a write's.
_SQLITE_MIGRATION_WAIT_MS = 600_000


@contextlib.contextmanager
def _one_at_a_time(database_url: str) -> Iterator[Config]:
    """The Alembic configuration of a migration that holds the database's migration lock
    for its whole transaction.

    Replicas that migrate on start (``serve --migrate``, ``NUMPARITY_MIGRATE_ON_START``,
    a Deployment's init step) start at once: without a lock two ran the same revisions
    side by side, and the second failed (a type or column that already exists) and
    crash-looped. With it, the others wait for the first to commit, then find the schema
    current and do nothing. PostgreSQL: a transaction-level advisory lock, taken before
    Alembic reads the current revision (its DDL is transactional: one transaction);
    SQLite: the write lock (``BEGIN IMMEDIATE``), waited for as long as a migration may
    take. A dead migrator's lock goes with its connection.
    """
    settings = Settings(database_url=database_url)
    engine = create_engine_for(settings, pooled=False)
    try:
        with engine.connect() as connection:
            sqlite = connection.dialect.name == "sqlite"
            if sqlite:
                _sqlite_pragma(connection, f"busy_timeout = {_SQLITE_MIGRATION_WAIT_MS}")
                # Batch mode copies and drops tables: not with foreign keys enforced.
                _sqlite_pragma(connection, "foreign_keys = OFF")
                connection.execution_options(**{WRITE_OPTION: True})
                connection.begin()  # BEGIN IMMEDIATE (kit.db)
            else:
                connection.execute(select(func.pg_advisory_xact_lock(MIGRATION_LOCK_KEY)))
            config = alembic_config(database_url)
            config.attributes["connection"] = connection
            yield config
            connection.commit()
            if sqlite:
                _sqlite_pragma(connection, "foreign_keys = ON")
    finally:
        engine.dispose()


def _sqlite_pragma(connection: Connection, pragma: str) -> None:
    """A PRAGMA straight to the driver, outside any transaction (kit.db takes the sqlite3
    module's transaction control away): inside one, foreign_keys is a no-op."""
    cursor = connection.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    try:
        cursor.execute(f"PRAGMA {pragma}")
    finally:
        cursor.close()


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


def current_revision(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()
