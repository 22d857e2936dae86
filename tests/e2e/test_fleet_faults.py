"""The fleet fault scenario of ``bench/fleet.py``, smaller: 6 agents for 14 s on two
server processes and a PostgreSQL instance of the test's own, the database stopped for
3 s and one server killed (SIGKILL) and started again, then every spool flushed.

Nothing may be lost, duplicated, stored incomplete or set aside, every spool must be
empty at the end, and the faults must really have happened. The scenario itself lives in
``bench/_faults.py`` (one copy for the bench and this test). It needs PostgreSQL's
binaries (``initdb``, ``pg_ctl``, ``postgres`` in ``/usr/lib/postgresql/*/bin`` or
``NUMPARITY_PG_BIN``; CI installs them) and skips without them.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def faults_module() -> ModuleType:
    # Appended, not prepended: bench/'s scripts must not shadow anything installed.
    if str(BENCH) not in sys.path:
        sys.path.append(str(BENCH))
    import _faults

    return _faults


@pytest.mark.timeout(300)
def test_no_run_lost_or_duplicated_through_a_database_outage_and_a_killed_server(
    tmp_path: Path,
) -> None:
    faults = faults_module()
    try:
        faults.find_postgres_bin()
    except faults.PostgresUnavailable as exc:
        pytest.skip(str(exc))
    scenario = faults.Scenario(agents=6, duration=14, db_outage_at=3, db_outage=3,
                               kill_at=7, restart_after=2, flush_timeout=60, timeout=10)
    try:
        report = faults.run_scenario(scenario, tmp_path)
    except faults.PostgresUnavailable as exc:
        pytest.skip(str(exc))
    summary = "\n".join(report.lines())
    print(summary)

    assert report.sent >= 30, summary
    assert report.lost == 0, summary
    assert report.duplicated == 0, summary
    assert report.incomplete == 0, summary
    assert report.set_aside == {}, summary
    assert report.still_spooled == 0, summary
    assert report.agent_errors == [], summary
    assert report.stored == report.sent == report.rows, summary
    outcomes = report.outcomes()
    assert outcomes["4xx"] == 0 and outcomes["other 5xx"] == 0, summary

    # The faults happened, and the agents felt them.
    outage, kill = report.faults
    assert outage.what == "database stopped" and kill.what == "server killed"
    assert outage.ended - outage.began >= 3
    assert report.outcomes(report.window(outage))["503"] > 0, summary
    assert report.killed_pid and report.restarted_pid, summary
    assert report.killed_pid != report.restarted_pid
    assert report.outcomes(report.window(kill))["unreachable"] > 0, summary
    assert report.served_after_restart() > 0, summary

    # The PostgreSQL instance is gone with its folder.
    assert not Path(report.extra["postgres_root"]).exists()
