"""Shared database fixtures: every database test runs on SQLite and on PostgreSQL.

- ``database_url``: an empty database, fresh per test. SQLite: a file in ``tmp_path``.
  PostgreSQL: a uniquely named database created on the server of
  ``NUMPARITY_TEST_DATABASE_URL`` and dropped afterwards (skipped when it is unset,
  with an example value; the summary folds those skips into one line).
- ``migrated_database_url``: the same, migrated to head (a copy of a template migrated
  once per test process).
- ``live_server``: ``numparity-server serve`` as a real uvicorn subprocess on a free
  loopback port, with an agent, a reader and an admin token.

The server's packages (SQLAlchemy, psycopg, the server itself) are imported by the
fixtures that need them, never at module level: ``tests/agent`` runs where only the
agent is installed (``pip install '.[agent]'`` and pytest), and a test that needs a
server or a database skips there, saying which package is missing
(tests/agent/test_agent_tests_alone.py runs them so).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from helpers import scheduling
from helpers.processes import (
    start_server,
    stop_process,
    wait_ready,
)

TEST_DATABASE_ENV = "NUMPARITY_TEST_DATABASE_URL"
# A read computes comparisons for up to NUMPARITY_COMPUTE_SECONDS, then answers the rest
# as pending (kit.compute): tests never depend on how fast the machine is, so every app
# and server they start (all read the environment) computes all; the tests of the
# deadline set their own.
os.environ.setdefault("NUMPARITY_COMPUTE_SECONDS", "3600")
TESTS = Path(__file__).resolve().parent
POSTGRESQL_UNSET = (
    f"{TEST_DATABASE_ENV} is unset: the PostgreSQL case of each database test needs it, "
    f"e.g. {TEST_DATABASE_ENV}=postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Iterator[pytest.TestReport]:
    """A skip raised by a shared fixture is reported at the fixture's line.

    pytest reports a fixture's skip at each test's own line (to say which test skipped),
    so `-ra` cannot fold them: one cause, PostgreSQL not configured, filled ~155 summary
    lines. At the fixture's line the summary folds them into one, `SKIPPED [155]
    tests/conftest.py:NN: reason`. Skips in a test's own module keep their place.
    """
    report: pytest.TestReport = yield
    if report.skipped and call.excinfo is not None and isinstance(report.longrepr, tuple):
        ours = [entry for entry in call.excinfo.traceback
                if Path(entry.path).is_relative_to(TESTS)]
        if ours and Path(ours[-1].path) != Path(item.path):
            where = ours[-1]
            report.longrepr = (str(where.path), where.lineno + 1, report.longrepr[2])
    return report


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--tier", choices=("all", "fast"), default="all",
        help="fast: only the unit tests, for development (`make test-fast`): no test of "
             f"{', '.join(scheduling.SLOW_FOLDERS)}, none measured over "
             f"{scheduling.FAST_SECONDS:g} s in tests/durations.json. CI runs all.",
    )  # fmt: skip


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests that share an expensive fixture form one xdist group; longest units first
    (helpers/scheduling.py). Runs before xdist reads the groups (tryfirst)."""
    durations = scheduling.load_durations()
    if config.getoption("tier") == "fast":
        slow = [item for item in items if not scheduling.is_fast(item, durations)]
        if slow:
            config.hook.pytest_deselected(items=slow)
            kept = set(map(id, slow))
            items[:] = [item for item in items if id(item) not in kept]
    groups = scheduling.plan(items, durations)
    for item in items:
        if item.nodeid in groups:
            name = scheduling.group_name(groups[item.nodeid])
            item.add_marker(pytest.mark.xdist_group(name))
            scheduling.suffix_group(config, item, name)


# `make test-durations`: every test's seconds (setup, call and teardown), as the
# scheduler above reads them. Recorded where the reports arrive (xdist's controller).
_DURATIONS_OUT = os.environ.get("NUMPARITY_TEST_DURATIONS_OUT")
_measured: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if _DURATIONS_OUT:
        nodeid = scheduling.plain_nodeid(report.nodeid)
        _measured[nodeid] = _measured.get(nodeid, 0.0) + report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _DURATIONS_OUT and _measured and not hasattr(session.config, "workerinput"):
        rounded = {k: round(v, 2) for k, v in sorted(_measured.items())}
        Path(_DURATIONS_OUT).write_text(json.dumps(rounded, indent=0) + "\n")


# What a database or a live server needs beyond the agent ('.[server]').
SERVER_PACKAGES = ("sqlalchemy", "numparity_server.kit.db")


def require_server_packages() -> None:
    """Skip the calling fixture's tests where the server is not installed."""
    for name in SERVER_PACKAGES:
        pytest.importorskip(name, reason=f"{name} is not importable: this test needs the "
                            "server's packages (pip install '.[server]')")


def _libpq_url(url: str) -> str:
    """A SQLAlchemy URL as psycopg's connection string."""
    from sqlalchemy import make_url

    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _create_postgresql_database(base: str, prefix: str,
                                template: str | None = None) -> tuple[str, str]:
    """A new database on the server of ``base``, empty or a copy of ``template``: its name
    and its URL."""
    import psycopg
    from sqlalchemy import make_url

    name = f"{prefix}_{uuid.uuid4().hex[:16]}"
    parsed = make_url(base)
    if parsed.drivername in ("postgres", "postgresql"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    url = parsed.set(database=name).render_as_string(hide_password=False)
    with psycopg.connect(_libpq_url(base), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"'
                      + (f' TEMPLATE "{template}"' if template else ""))
    return name, url


class DatabaseTemplates:
    """Databases migrated to head once per test process, which each test's database is
    copied from: Alembic's ~20 revisions take seconds, a copy takes milliseconds (SQLite:
    the file) or a fraction of a second (PostgreSQL: CREATE DATABASE … TEMPLATE). Made
    from the checkout's migrations when first asked, so never stale; dropped at the end."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._made: dict[str, str] = {}
        self._dropped: list[Callable[[], None]] = []

    def sqlite(self) -> Path:
        if "sqlite" not in self._made:
            from numparity_server.kit import migrate
            from numparity_server.kit.db import dispose_engine

            url = f"sqlite:///{self.folder / 'template.db'}"
            migrate.upgrade(url)
            dispose_engine(url)  # the last connection checkpoints the WAL into the file
            self._made["sqlite"] = str(self.folder / "template.db")
        return Path(self._made["sqlite"])

    def postgresql(self, base: str) -> str:
        if "postgresql" not in self._made:
            import psycopg

            from numparity_server.kit import migrate
            from numparity_server.kit.db import dispose_engine

            name, url = _create_postgresql_database(base, "numparity_template")

            def drop() -> None:
                with psycopg.connect(_libpq_url(base), autocommit=True) as admin:
                    admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

            self._dropped.append(drop)
            migrate.upgrade(url)
            dispose_engine(url)  # CREATE DATABASE … TEMPLATE needs it without connections
            self._made["postgresql"] = name
        return self._made["postgresql"]

    def close(self) -> None:
        for drop in self._dropped:
            drop()


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path,
                 database_templates: DatabaseTemplates) -> Iterator[str]:
    """An empty database, SQLite and PostgreSQL; for a test that also asks for
    ``migrated_database_url``, a PostgreSQL one is made from the migrated template at once
    (not made empty, dropped and made again)."""
    require_server_packages()
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'numparity.db'}"
        from numparity_server.kit.db import dispose_engine

        dispose_engine(f"sqlite:///{tmp_path / 'numparity.db'}")
        return

    base = os.environ.get(TEST_DATABASE_ENV)
    if not base:
        pytest.skip(POSTGRESQL_UNSET)
    psycopg = pytest.importorskip("psycopg", reason="psycopg is not importable: the "
                                  "PostgreSQL case needs the server's packages")
    template = (database_templates.postgresql(base)
                if "migrated_database_url" in request.fixturenames else None)
    name, url = _create_postgresql_database(base, "numparity_test", template)
    try:
        yield url
    finally:
        from numparity_server.kit.db import dispose_engine

        dispose_engine(url)
        with psycopg.connect(_libpq_url(base), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def database_templates(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DatabaseTemplates]:
    templates = DatabaseTemplates(tmp_path_factory.mktemp("templates"))
    try:
        yield templates
    finally:
        templates.close()


@pytest.fixture
def migrated_database_url(database_url: str, database_templates: DatabaseTemplates) -> str:
    """``database_url`` at the migrations' head: a copy of a migrated template."""
    from sqlalchemy import make_url

    parsed = make_url(database_url)
    if parsed.get_backend_name() == "sqlite":
        shutil.copy(database_templates.sqlite(), parsed.database)
        return database_url
    return database_url  # made from the template by database_url


@dataclass
class LiveServer:
    base_url: str
    database_url: str
    agent_token: str
    reader_token: str
    admin_token: str
    log_path: Path
    process: subprocess.Popen = field(repr=False)

    def headers(self, role: str = "reader") -> dict[str, str]:
        token = {"agent": self.agent_token, "reader": self.reader_token,
                 "admin": self.admin_token}[role]
        return {"Authorization": f"Bearer {token}"}

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def _create_tokens(roles: tuple[str, ...], database_url: str) -> dict[str, str]:
    """A token per role, made in this process as `numparity-server token create` makes
    them (tests/server/cli tests the command): three CLI processes cost ~3 CPU seconds
    per live server."""
    from numparity_server.auth import service
    from numparity_server.kit.db import dispose_engine, get_engine, session_factory
    from numparity_server.kit.settings import Settings

    settings = Settings(database_url=database_url)
    try:
        with session_factory(get_engine(settings))() as session:
            return {role: service.create_token(session=session, role=role,
                                               label=f"live-{role}").token
                    for role in roles}
    finally:
        dispose_engine(database_url)


@pytest.fixture
def live_server(migrated_database_url: str, tmp_path: Path) -> Iterator[LiveServer]:
    url = migrated_database_url
    log_path = tmp_path / "server.log"
    env = {**os.environ, "NUMPARITY_DATABASE_URL": url, "NUMPARITY_MIGRATE_ON_START": "false"}
    process, base_url = start_server(log_path, env, "--log-level", "warning")
    try:
        tokens = _create_tokens(("agent", "reader", "admin"), url)
    except BaseException:
        process.kill()
        process.wait(timeout=15)
        raise
    server = LiveServer(base_url=base_url, database_url=url,
                        agent_token=tokens["agent"], reader_token=tokens["reader"],
                        admin_token=tokens["admin"], log_path=log_path, process=process)
    try:
        wait_ready(server.base_url, process, log_path)
        yield server
    finally:
        stop_process(process)
