"""Engines and sessions: one engine per database URL.

SQLite runs in WAL mode with a busy timeout. Reads run in deferred transactions, which
never wait under WAL. A transaction that writes is opened by ``writing()``: on SQLite it
starts with ``BEGIN IMMEDIATE`` (a deferred transaction that reads and then writes fails
with SQLITE_BUSY when another writer committed in between, and the busy timeout does not
help there), and the writers of one process queue on a lock instead of polling the
database file with the busy handler's sleeps, which is what made p99 latency long.
PostgreSQL goes through psycopg 3 with a connection pool.

A SQLite file the server creates is readable by its owner only (0600, whatever the
umask): it holds the tokens' hashes and the fleet's data. SQLite gives its -wal and -shm
files the mode of the database file. A file that exists keeps the mode it has.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from sqlalchemy import Engine, create_engine, event, make_url, select
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool, StaticPool

from numparity_server.kit.settings import Settings
from numparity_server.models.fleet_version import FLEET_VERSION_ROW, FleetVersion

_engines: dict[tuple[str, bool], Engine] = {}
_lock = threading.Lock()
# Execution option that marks a connection's transaction as a write (see writing()).
WRITE_OPTION = _WRITE = "numparity_write"
_sqlite_writer_locks: dict[str, threading.Lock] = {}
# Session.info key of a session inside snapshot(): the writes it deferred (after_read()).
_SNAPSHOT = "numparity_snapshot"


def normalize_url(url: str | URL) -> URL:
    """``postgres://`` and ``postgresql://`` use psycopg 3 (the driver the server ships)."""
    parsed = make_url(url)
    if parsed.drivername in ("postgres", "postgresql"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def is_sqlite(url: str | URL) -> bool:
    return make_url(url).get_backend_name() == "sqlite"


def create_engine_for(settings: Settings, *, pooled: bool = True) -> Engine:
    """A new engine for ``settings.database_url`` (``pooled=False``: one connection per use,
    for the CLI and migrations)."""
    parsed = normalize_url(settings.database_url)
    if parsed.get_backend_name() == "sqlite":
        return _sqlite_engine(parsed, settings, pooled=pooled)
    # No JIT: the server's queries are short, and PostgreSQL's JIT, triggered by a cost
    # estimate, compiled a look-up of 500 (environment, outcome) pairs for 13 s at
    # 100,000 nodes before running it in milliseconds.
    connect_args = {"options": "-c jit=off"}
    if not pooled:
        return create_engine(parsed, poolclass=NullPool, connect_args=connect_args)
    return create_engine(
        parsed,
        pool_size=settings.db_pool_size,
        max_overflow=settings.db_max_overflow,
        pool_pre_ping=True,
        connect_args=connect_args,
    )


def _sqlite_engine(url: URL, settings: Settings, *, pooled: bool) -> Engine:
    memory = url.database in (None, "", ":memory:")
    kwargs: dict[str, Any] = {"connect_args": {"check_same_thread": False}}
    if memory:
        kwargs["poolclass"] = StaticPool
    elif not pooled:
        kwargs["poolclass"] = NullPool
    engine = create_engine(url, **kwargs)
    busy_timeout = settings.sqlite_busy_timeout_ms
    if not memory and not str(url.database).startswith("file:"):
        path = str(url.database)

        @event.listens_for(engine, "do_connect")
        def _create_private(*_args: Any) -> None:
            # Created here, empty (a valid SQLite database), rather than by sqlite3's
            # open, which would make it 0644 under the usual umask. Where it cannot be
            # (no such folder, no permission), sqlite3 fails next with its own error.
            with contextlib.suppress(OSError):
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take transaction control away from the sqlite3 module (see module docstring);
        # PRAGMAs below must run outside a transaction.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {int(busy_timeout)}")
        if not memory:
            cursor.execute("PRAGMA journal_mode = WAL")
            cursor.execute("PRAGMA synchronous = NORMAL")
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        write = connection.get_execution_options().get(_WRITE, False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

    return engine


def release(session: Session) -> None:
    """End the session's (read) transaction and give its connection back to the pool,
    before a long computation: a request that computes holds no connection others wait
    for. The session begins a new transaction when next used. Only reads come before.

    Inside ``snapshot()`` it does nothing: what the read reads after the computation must
    come from the snapshot it read before it."""
    if _SNAPSHOT in session.info:
        return
    session.rollback()


@contextlib.contextmanager
def snapshot(session: Session) -> Iterator[Session]:
    """One read of the fleet at one consistent snapshot: every statement of the block sees
    the database as of the block's first statement, whatever commits meanwhile.

    A fleet-wide read runs several statements (the answers counted, then the rows of a
    page, the environments they name, ...). Under PostgreSQL's READ COMMITTED each saw its
    own commits, so an upload committed between two of them (a node moved to a new
    environment) made the second name rows the first had not read: a KeyError, a 500, on
    exactly the reads a lab looks at during an upgrade. So the block is one transaction,
    REPEATABLE READ and READ ONLY on PostgreSQL (a snapshot taken at its first statement;
    read-only transactions never fail to serialize), a deferred transaction on SQLite
    (WAL: its snapshot is taken at its first read and kept until it ends).

    ``release()`` keeps the transaction inside the block, so a read that computes holds
    its connection until it ends (a fleet-wide read computes once per question and
    version: ``kit.readcache``; its askers wait holding none). Writes the read wants to
    make (kept comparisons) are handed to ``after_read()`` and run once the block ends,
    each in its own transaction.
    """
    session.rollback()  # whatever the session read before (the token check) ends here
    if session.get_bind().dialect.name == "postgresql":
        session.connection(execution_options={"isolation_level": "REPEATABLE READ",
                                              "postgresql_readonly": True})
    deferred: list[Callable[[], None]] = []
    session.info[_SNAPSHOT] = deferred
    try:
        yield session
    finally:
        del session.info[_SNAPSHOT]
        session.rollback()
    for write in deferred:
        write()


def after_read(session: Session, write: Callable[[], None]) -> None:
    """``write()`` now, or once the session's ``snapshot()`` ends (a read-only snapshot
    takes no write, and a write's commit would end the snapshot)."""
    deferred = session.info.get(_SNAPSHOT)
    if deferred is None:
        write()
    else:
        deferred.append(write)


@contextlib.contextmanager
def writing(session: Session, *, changes_answers: bool = True) -> Iterator[Session]:
    """A write transaction: committed when the block ends, rolled back on an exception.

    It advances the fleet's version (``models.fleet_version``) as its last statement, so
    the version changes exactly when the write commits, and every replica's read cache
    sees it on its next read. ``changes_answers=False`` for a write no fleet-wide read
    depends on (a token, a kept comparison: a cache of a pure function of content), so
    it does not drop the kept answers. The row is held from that statement to the
    commit, the shortest the writers can queue on it.

    On SQLite what the session read before (the token check) is committed first, so the
    write starts with BEGIN IMMEDIATE on a fresh snapshot, and the process's writers take
    turns on a lock. PostgreSQL (READ COMMITTED: every statement sees what is committed)
    goes on in the transaction the read began: no COMMIT and BEGIN round trip.
    """
    if _SNAPSHOT in session.info:
        raise RuntimeError("a write inside a read's snapshot: hand it to after_read()")
    bind = session.get_bind()
    sqlite = bind.dialect.name == "sqlite"
    writer_lock: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
    if sqlite:
        if session.in_transaction():
            session.commit()
        engine = bind if isinstance(bind, Engine) else bind.engine
        with _lock:
            writer_lock = _sqlite_writer_locks.setdefault(str(engine.url), threading.Lock())
    with writer_lock:
        if sqlite:
            session.connection(execution_options={_WRITE: True})  # BEGIN IMMEDIATE
        try:
            yield session
            if changes_answers:
                _advance_fleet_version(session)
            session.commit()
        except BaseException:
            session.rollback()
            raise


def _advance_fleet_version(session: Session) -> None:
    # An upsert: a database made by ``create_all`` (not migrated) has no row yet.
    table = FleetVersion.__table__
    session.execute(
        dialect_insert(session, table).values(id=FLEET_VERSION_ROW, version=1)
        .on_conflict_do_update(index_elements=["id"],
                               set_={"version": table.c.version + 1}))


def get_engine(settings: Settings) -> Engine:
    """The shared engine of ``settings.database_url`` (created on first use)."""
    key = (str(normalize_url(settings.database_url)), True)
    with _lock:
        engine = _engines.get(key)
        if engine is None:
            engine = create_engine_for(settings)
            _engines[key] = engine
        return engine


def dispose_engine(url: str | URL) -> None:
    """Close the pooled connections of ``url``'s shared engine (tests drop databases)."""
    key = (str(normalize_url(url)), True)
    with _lock:
        engine = _engines.pop(key, None)
    if engine is not None:
        engine.dispose()


def session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(bind=engine, expire_on_commit=False, autoflush=False)


def chunked(items: Sequence[Any], size: int = 500) -> Iterator[Sequence[Any]]:
    """Slices of ``items`` small enough for an ``IN (...)`` on any backend."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


def lookup(session: Session, key: Any, value: Any, keys: Iterable[Any]) -> dict[Any, Any]:
    """``{key: value}`` of the rows whose ``key`` column is one of ``keys`` (chunked IN)."""
    found: dict[Any, Any] = {}
    for part in chunked(sorted(set(keys))):
        found.update((k, v) for k, v in session.execute(select(key, value).where(key.in_(part))))
    return found


def insert_ignoring_conflicts(
    session: Session, table: Any, rows: Iterable[dict[str, Any]], *, keys: Sequence[str]
) -> None:
    """Bulk ``INSERT ... ON CONFLICT (keys) DO NOTHING`` (content-addressed rows).

    Safe against a concurrent writer inserting the same key between our check and our
    insert: the loser's row is simply skipped.
    """
    rows = list(rows)
    if not rows:
        return
    session.execute(dialect_insert(session, table).on_conflict_do_nothing(index_elements=keys),
                    rows)


def dialect_insert(session: Session | str, table: Any) -> Any:
    """The backend's INSERT construct (both SQLite and PostgreSQL know ON CONFLICT), for a
    session or a dialect name."""
    from sqlalchemy.dialects import postgresql, sqlite

    name = session if isinstance(session, str) else session.get_bind().dialect.name
    if name == "postgresql":
        return postgresql.insert(table)
    if name == "sqlite":
        return sqlite.insert(table)
    raise RuntimeError(f"unsupported database backend {name!r}")  # pragma: no cover


def codepoint_order(session: Session, column: Any) -> Any:
    """``column`` compared in code point order, as Python compares strings (PostgreSQL's
    default collation follows the locale; SQLite's BINARY already is code point order),
    so a "first node name" from a query is the one the analysis would pick."""
    if session.get_bind().dialect.name == "postgresql":
        return column.collate("C")
    return column
