"""Alembic environment of the numparity server (SQLite and PostgreSQL).

There is no alembic.ini: ``numparity_server.kit.migrate.alembic_config`` builds the
configuration in code, and may hand over an open connection in
``config.attributes["connection"]``.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from numparity_server.kit.db import create_engine_for
from numparity_server.kit.settings import Settings
from numparity_server.models import Base

config = context.config
target_metadata = Base.metadata


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things in place; batch mode recreates the table.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )


def _run(connection: Connection) -> None:
    _configure(connection)
    with context.begin_transaction():
        context.run_migrations()


def _sqlite_foreign_keys(connection: Connection, enabled: bool) -> None:
    """Batch mode copies and drops tables; with foreign keys enforced, dropping a
    referenced table would cascade or fail. The PRAGMA is a no-op inside a transaction,
    so it goes straight to the driver (in autocommit, see kit.db) before one begins."""
    cursor = connection.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    try:
        cursor.execute(f"PRAGMA foreign_keys = {'ON' if enabled else 'OFF'}")
    finally:
        cursor.close()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    # The URL is the one `kit.migrate` put in the Alembic config; the rest of the settings
    # (SQLite's busy timeout) from NUMPARITY_* as everywhere else.
    settings = Settings(database_url=config.get_main_option("sqlalchemy.url") or "")
    engine = create_engine_for(settings, pooled=False)
    try:
        with engine.connect() as connection:
            sqlite = connection.dialect.name == "sqlite"
            if sqlite:
                _sqlite_foreign_keys(connection, False)
            _run(connection)
            connection.commit()
            if sqlite:
                _sqlite_foreign_keys(connection, True)
    finally:
        engine.dispose()


def run_migrations_offline() -> None:
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
