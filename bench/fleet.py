"""Fleet load-and-fault benchmark: 50 agents uploading through a database outage and a
killed server, on loopback.

Not run by CI (its smaller version is ``tests/e2e/test_fleet_faults.py``). It starts a
PostgreSQL instance of its own (``initdb``/``pg_ctl`` into a temporary folder, on a free
port; as root they run as the ``postgres`` user), two ``numparity-server serve``
processes on it, and ``--agents`` simulated agents for ``--duration`` seconds, each
writing a run to its own spool every 1-2 s and uploading what is spooled with the agent's
own spool functions to either server (backing off after a failure as the agent's flush
does). In the middle the database is stopped for
``--db-outage`` seconds (from 40 % of the duration) and one server process is killed
(SIGKILL, at 60 %) and started again ``--restart-after`` seconds later on the same port.
After the load every agent flushes until its spool is empty. The scenario lives in
``bench/_faults.py``.

    .venv/bin/python bench/fleet.py [--agents 50] [--duration 60] [--db-outage 10]
        [--db-outage-at S] [--kill-at S] [--restart-after 5] [--json FILE]

Prints runs sent, stored, still spooled, lost (must be 0), duplicated (must be 0),
incomplete and set-aside documents, the outcome of every upload by kind (overall, during
each fault and elsewhere), p50/p99 latency of successful uploads and runs/s. Exit code 1
when a run was lost, duplicated, stored incomplete, set aside or left in a spool, or an
agent failed. The PostgreSQL instance and every process are stopped and removed at the
end, also on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from _faults import PostgresUnavailable, Scenario, run_scenario


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=50)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of load")
    parser.add_argument("--db-outage", type=float, default=10.0,
                        help="seconds the database is stopped (0: never)")
    parser.add_argument("--db-outage-at", type=float, default=None,
                        help="seconds into the load (default 40%% of --duration)")
    parser.add_argument("--kill-at", type=float, default=None,
                        help="seconds into the load to kill a server (default 60%% of "
                             "--duration; negative: never)")
    parser.add_argument("--restart-after", type=float, default=5.0)
    parser.add_argument("--interval", type=float, nargs=2, default=(1.0, 2.0),
                        metavar=("MIN", "MAX"), help="seconds between an agent's runs")
    parser.add_argument("--new-environment-share", type=float, default=0.02)
    parser.add_argument("--agents-per-process", type=int, default=10)
    parser.add_argument("--flush-timeout", type=float, default=180.0,
                        help="seconds after the load to empty every spool")
    parser.add_argument("--fresh-tls-context", action="store_true",
                        help="let httpx load the CA bundle for every upload, as one node "
                             "does (by default the simulated agents share one TLS context)")
    parser.add_argument("--json", type=Path, help="also write the figures to FILE")
    parser.add_argument("--keep", action="store_true",
                        help="keep the work folder (spools, server logs)")
    args = parser.parse_args()

    scenario = Scenario(
        agents=args.agents, duration=args.duration, db_outage=args.db_outage,
        db_outage_at=(0.4 * args.duration if args.db_outage_at is None else args.db_outage_at),
        kill_at=0.6 * args.duration if args.kill_at is None else args.kill_at,
        restart_after=args.restart_after, interval=tuple(args.interval),
        new_environment_share=args.new_environment_share,
        agents_per_process=args.agents_per_process, flush_timeout=args.flush_timeout,
        share_tls_context=not args.fresh_tls_context)
    try:
        scenario.check()
    except ValueError as exc:
        parser.error(str(exc))

    def terminated(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt  # the scenario's finally blocks clean up

    signal.signal(signal.SIGTERM, terminated)
    workdir = Path(tempfile.mkdtemp(prefix="numparity-fleet-"))
    began = time.monotonic()

    def say(line: str) -> None:
        print(f"[{time.monotonic() - began:6.1f} s] {line}", flush=True)

    try:
        report = run_scenario(scenario, workdir, say)
    except PostgresUnavailable as exc:
        print(f"cannot run: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: stopped every process and the database", file=sys.stderr)
        return 130
    finally:
        if args.keep:
            print(f"work folder kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    print()
    for line in report.lines():
        print(line)
    if args.json:
        args.json.write_text(json.dumps(report.to_json(), indent=2, default=str))
    return 1 if report.problems() else 0


if __name__ == "__main__":
    sys.exit(main())
