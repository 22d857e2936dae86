"""Browser tests: real Chromium (Debian's ``chromium``, driven by Playwright) against a
real ``numparity-server serve`` on the database of the simulated fleet.

- ``fleet``: ``numparity-server demo --no-serve --workdir DIR`` run once per session (the
  real agents, ~30-60 s); DIR keeps ``numparity.db``. ``NUMPARITY_BROWSER_FLEET=DIR``
  reuses (or builds once and then keeps) the fleet in DIR, for quicker local reruns.
- ``dashboard``: a reader token made by the CLI and the server as a subprocess on a free
  loopback port, reads closed (the default): pages ask for the token.
- ``browser``: one headless Chromium per session; ``reader_state``: the cookies of one
  login through the token form, reused by ``page``.
- ``page`` (logged in) and ``anonymous_page`` (no cookie): a fresh browser context per
  test, console errors and uncaught exceptions recorded; a test fails when any are left
  unchecked at its end (``assert_no_console_errors``).

The folder is skipped, with the reason, where Chromium (``/usr/bin/chromium`` or
``$NUMPARITY_CHROMIUM``) or Playwright is missing, unless ``NUMPARITY_BROWSER_TESTS=
required`` (set by ``.ci/run``), where that is a failure.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.browser import (
    ConsoleRecorder,
    Dashboard,
    assert_no_console_errors,
    browser_tests_required,
    chromium_path,
    login,
    missing_requirement,
)
from helpers.manual import built_manual
from helpers.processes import (
    run_cli,
    server_command,
    start_server,
    stop_process,
    wait_ready,
)

FLEET_ENV = "NUMPARITY_BROWSER_FLEET"


def pytest_runtest_setup(item: pytest.Item) -> None:
    reason = missing_requirement()
    if reason is None:
        return
    if browser_tests_required():
        pytest.fail(f"browser tests are required here but cannot run: {reason}")
    pytest.skip(f"browser tests: {reason}")


@dataclass(frozen=True)
class Fleet:
    workdir: Path
    database_url: str
    build_seconds: float | None  # None: reused from $NUMPARITY_BROWSER_FLEET


def _demo_environment() -> dict[str, str]:
    # As tests/e2e/test_demo.py: the demo makes its own database, tokens and server.
    return {k: v for k, v in os.environ.items() if not k.startswith("NUMPARITY_")}


@pytest.fixture(scope="session")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Fleet:
    kept = os.environ.get(FLEET_ENV)
    workdir = Path(kept) if kept else tmp_path_factory.mktemp("fleet")
    database = workdir / "numparity.db"
    url = f"sqlite:///{database}"
    if kept and database.exists():
        return Fleet(workdir=workdir, database_url=url, build_seconds=None)
    if database.exists():  # a half-built fleet of an interrupted run
        database.unlink()
    started = time.monotonic()
    done = subprocess.run(
        [*server_command(), "demo", "--no-serve", "--workdir", str(workdir)],
        env=_demo_environment(), capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    took = time.monotonic() - started
    if done.returncode != 0:
        database.unlink(missing_ok=True)
        pytest.fail(f"numparity-server demo --no-serve failed ({done.returncode}):\n"
                    f"{done.stdout}\n{done.stderr}")
    assert database.exists(), f"the demo left no database in {workdir}:\n{done.stdout}"
    print(f"\nbrowser tests: the simulated fleet was built in {took:.1f} s ({workdir})")
    return Fleet(workdir=workdir, database_url=url, build_seconds=took)


@pytest.fixture(scope="session")
def dashboard(fleet: Fleet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dashboard]:
    url = fleet.database_url
    reader = run_cli("--database-url", url, "token", "create", "--role", "reader",
                            "--label", "browser", database_url=url).stdout.strip()
    assert reader and "\n" not in reader, reader
    log_path = tmp_path_factory.mktemp("dashboard") / "server.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMPARITY_")}
    # The manual the pages' "?" opens: the checkout's, built as the wheel carries it.
    env.update(NUMPARITY_DATABASE_URL=url, NUMPARITY_MIGRATE_ON_START="false",
               NUMPARITY_MANUAL_DIR=str(built_manual()))
    process, base_url = start_server(log_path, env, "--log-level", "warning")
    try:
        wait_ready(base_url, process, log_path)
        yield Dashboard(base_url=base_url, database_url=url, reader_token=reader,
                        log_path=log_path)
    finally:
        stop_process(process)


@pytest.fixture(scope="session")
def api(dashboard: Dashboard) -> Iterator[httpx.Client]:
    """The JSON API as the reader, to find run ids the pages should show."""
    with httpx.Client(base_url=f"{dashboard.base_url}/api/v1", timeout=60,
                      headers={"Authorization": f"Bearer {dashboard.reader_token}"}) as client:
        yield client


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=chromium_path(), headless=True,
                                              args=["--no-sandbox"])
        try:
            yield chromium
        finally:
            chromium.close()


def _new_page(context: Any) -> Any:
    page = context.new_page()
    page.set_default_timeout(15_000)
    recorder = ConsoleRecorder()
    recorder.attach(page)
    page.numparity_console = recorder
    return page


@pytest.fixture(scope="session")
def reader_state(browser: Any, dashboard: Dashboard) -> dict[str, Any]:
    """What the browser keeps after one login through the token form (the cookie)."""
    context = browser.new_context(base_url=dashboard.base_url)
    try:
        page = _new_page(context)
        page.goto("/")
        login(page, dashboard.reader_token)
        state: dict[str, Any] = context.storage_state()
    finally:
        context.close()
    assert any(c["name"] == "numparity_token" for c in state["cookies"]), state["cookies"]
    return state


def _page_fixture(browser: Any, dashboard: Dashboard, **context_args: Any) -> Iterator[Any]:
    context = browser.new_context(base_url=dashboard.base_url,
                                  viewport={"width": 1400, "height": 900}, **context_args)
    try:
        page = _new_page(context)
        yield page
        assert_no_console_errors(page)
    finally:
        context.close()


@pytest.fixture
def page(browser: Any, dashboard: Dashboard, reader_state: dict[str, Any]) -> Iterator[Any]:
    """A page of a browser that logged in as the reader (it has the token cookie)."""
    yield from _page_fixture(browser, dashboard, storage_state=reader_state)


@pytest.fixture
def anonymous_page(browser: Any, dashboard: Dashboard) -> Iterator[Any]:
    """A page of a browser without the token cookie."""
    yield from _page_fixture(browser, dashboard)
