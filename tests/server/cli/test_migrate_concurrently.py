"""Migrations wait their turn: replicas that migrate on start begin at once, and each
`numparity-server migrate` waits for the one under way, then finds the schema current
and exits 0 (a Deployment that migrates on start crash-looped on the loser's error)."""

from __future__ import annotations

import multiprocessing
import sys

import pytest
from sqlalchemy import create_engine

from numparity_server.cli import main
from numparity_server.kit import migrate

MIGRATORS = 3


def _migrate(database_url: str, go: multiprocessing.synchronize.Event) -> None:
    go.wait(60)
    sys.exit(main(["--database-url", database_url, "migrate"]))


@pytest.mark.parametrize("start", [None, "0013"], ids=["empty", "from-0013"])
def test_three_migrations_at_once_all_exit_0_at_head(database_url, start):
    if start is not None:
        migrate.upgrade(database_url, start)
    # Processes forked from this one (the CLI's imports done once), released together.
    forked = multiprocessing.get_context("fork")
    go = forked.Event()
    migrators = [forked.Process(target=_migrate, args=(database_url, go))
                 for _ in range(MIGRATORS)]
    for process in migrators:
        process.start()
    go.set()
    for process in migrators:
        process.join(180)
    assert [process.exitcode for process in migrators] == [0] * MIGRATORS
    engine = create_engine(database_url)
    try:
        with engine.connect() as connection:
            assert migrate.current_revision(connection) == migrate.head_revision()
    finally:
        engine.dispose()
