"""``numparity-server``: migrate, serve, manage tokens, pin answers, apply retention, run
the demo.

Exit codes: 0 ok, 1 the command failed (message on stderr), 2 usage error.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from pydantic import ValidationError
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from numparity_server.auth.schemas import CreatedToken, TokenOut, binding_text
from numparity_server.kit.settings import Settings

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
# What each means (the manual's exit codes page is generated from it).
EXIT_CODES = {
    EXIT_OK: "ok",
    EXIT_FAILED: "the command failed, the message on stderr says why: the database cannot "
                 "be reached or is not migrated (run numparity-server migrate), no such token",
    EXIT_USAGE: "usage: a bad option or value, a NUMPARITY_* setting of the wrong type or "
                "out of its bounds, a policy file or NUMPARITY_MANUAL_DIR that cannot be "
                "used, --workers over 1 on SQLite",
}
# On SIGTERM, requests under way get this long to finish (seconds); then they are
# cancelled and the app stops its computations (kit.compute), so the process ends within
# about a computation's time more: a replacement never shares the port with a process
# still working for minutes.
GRACEFUL_S = 3


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--database-url", default=argparse.SUPPRESS,
                        help="SQLAlchemy URL (default: $NUMPARITY_DATABASE_URL, else "
                             "sqlite:///./numparity.db)")
    parser = argparse.ArgumentParser(
        prog="numparity-server", parents=[common],
        description="The numparity server: stores run documents and answers queries.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    migrate = commands.add_parser("migrate", parents=[common],
                                  help="upgrade the database schema to the newest revision")
    migrate.add_argument("--revision", default="head", help="target revision (default head)")

    serve = commands.add_parser("serve", parents=[common], help="run the HTTP server (uvicorn)")
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (0.0.0.0: every interface)")
    serve.add_argument("--port", type=int, default=8000, help="TCP port to listen on")
    serve.add_argument("--workers", type=int, default=1,
                       help="server processes (PostgreSQL only for more than one)")
    serve.add_argument("--migrate", action="store_true", help="migrate the database first")
    serve.add_argument("--policy", metavar="FILE",
                       help="the lab's policy file, TOML (or NUMPARITY_POLICY_FILE)")
    serve.add_argument("--log-level", default="info",
                       choices=["critical", "error", "warning", "info", "debug", "trace"],
                       help="uvicorn's log level")

    token = commands.add_parser("token", help="create, list and revoke API tokens")
    token_commands = token.add_subparsers(dest="token_command", required=True, metavar="ACTION")
    create = token_commands.add_parser("create", parents=[common],
                                       help="create a token and print it (shown once)")
    create.add_argument("--role", required=True, choices=["agent", "reader", "admin", "check"],
                        help="agent: uploads runs and findings (and checks); reader: reads "
                             "the API, the dashboard and /metrics; admin: both; check: reads "
                             "`numparity-agent check`'s plan and writes nothing (a training "
                             "job's preflight)")
    create.add_argument("--label", default="", help="who or what the token is for")
    create.add_argument("--node", action="append", default=[], metavar="NAME",
                        help="agent tokens: write runs of this node only (repeatable; with "
                             "neither --node nor --node-pattern the token writes any node)")
    create.add_argument("--node-pattern", action="append", default=[], metavar="GLOB",
                        help="agent tokens: write runs of the nodes this shell-style pattern "
                             "matches, e.g. 'gpu-*' (repeatable, case-sensitive)")
    token_commands.add_parser("list", parents=[common], help="list tokens (never the tokens "
                                                             "themselves)")
    revoke = token_commands.add_parser("revoke", parents=[common], help="revoke a token by id")
    revoke.add_argument("id", type=int, help="the token's id, as token list shows it")

    device = commands.add_parser(
        "device", help="confirm a device's move to another node; list the claims waiting")
    device_commands = device.add_subparsers(dest="device_command", required=True,
                                            metavar="ACTION")
    move = device_commands.add_parser(
        "move", parents=[common],
        help="the device belongs to NODE from now on: its claim's results join its history "
             "and its old node's latest results of it go")
    move.add_argument("device", help="GPU UUID, board serial, or identity uuid:… / serial:…")
    move.add_argument("--to", required=True, metavar="NODE", help="the node it moved to")
    device_commands.add_parser("claims", parents=[common],
                               help="list devices claimed by a node they do not belong to")

    retention = commands.add_parser(
        "retention", parents=[common],
        help="drop runs older than N days (never a node's latest) and content nothing uses",
    )
    retention.add_argument("--days", type=_positive, default=None,
                           help="keep runs received in the last N days (default: "
                                "$NUMPARITY_RETENTION_DAYS; unset keeps everything)")
    retention.add_argument("--batch-size", type=_positive, default=500,
                           help="runs per transaction (default 500)")
    retention.add_argument("--dry-run", action="store_true",
                           help="count what would be dropped, drop nothing")

    from numparity_server.goldens.cli import add_commands as add_golden_commands

    add_golden_commands(commands, common)

    commands.add_parser("demo", parents=[common], add_help=False,
                        help="run the demonstration (the arguments after it go to the demo)")
    return parser


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return value


def _split_demo(argv: list[str]) -> tuple[list[str], list[str]]:
    """``[opts] demo ARGS`` → (``[opts] demo``, ``ARGS``): the demo parses its own options."""
    index = 0
    while index < len(argv):
        token = argv[index]
        if token == "demo":
            return argv[: index + 1], argv[index + 1 :]
        if token == "--database-url":
            index += 2
            continue
        if not token.startswith("-"):
            break
        index += 1
    return argv, []


def main(argv: Sequence[str] | None = None) -> int:
    head, demo_args = _split_demo(list(sys.argv[1:] if argv is None else argv))
    parser = _parser()
    args = parser.parse_args(head)
    if (args.command == "token" and args.token_command == "create" and args.role != "agent"
            and (args.node or args.node_pattern)):
        parser.error(f"--node and --node-pattern bind agent tokens to nodes; a {args.role} "
                     "token is never bound (use --role agent)")
    database_url = getattr(args, "database_url", None)
    try:
        settings = Settings(database_url=database_url) if database_url else Settings()
    except ValidationError as exc:
        for problem in settings_problems(exc):
            print(f"error: {problem}", file=sys.stderr)
        return EXIT_USAGE
    try:
        if args.command == "migrate":
            return _migrate(settings, args.revision)
        if args.command == "serve":
            return _serve(settings, args)
        if args.command == "token":
            return _token(settings, args)
        if args.command == "device":
            return _device(settings, args)
        if args.command == "retention":
            return _retention(settings, args)
        if args.command == "golden":
            from numparity_server.goldens import cli as golden_cli

            return golden_cli.run(lambda: _migrated_engine(settings), args)
        if args.command == "demo":
            return _demo(demo_args)
    except SQLAlchemyError as exc:
        print(f"error: database {_safe_url(settings)}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    raise AssertionError(args.command)  # pragma: no cover - argparse enforces the choices


def settings_problems(exc: ValidationError) -> list[str]:
    """Each wrong setting, named by its variable: ``NUMPARITY_PAGE_MAX='0': Input should
    be greater than 0``."""
    prefix = str(Settings.model_config.get("env_prefix", ""))
    return [f"{prefix}{'_'.join(str(part) for part in error['loc']).upper()}="
            f"{error.get('input')!r}: {error['msg']}" for error in exc.errors()]


def _safe_url(settings: Settings) -> str:
    from sqlalchemy import make_url

    return make_url(settings.database_url).render_as_string(hide_password=True)


def _migrate(settings: Settings, revision: str) -> int:
    from numparity_server.kit import migrate

    migrate.upgrade(settings.database_url, revision)
    print(f"database {_safe_url(settings)} is at revision {revision}", file=sys.stderr)
    return EXIT_OK


def _serve(settings: Settings, args: argparse.Namespace) -> int:
    from numparity_server.kit.db import is_sqlite

    if args.workers < 1:
        print("error: --workers must be at least 1", file=sys.stderr)
        return EXIT_USAGE
    if args.workers > 1 and is_sqlite(settings.database_url):
        print(f"error: --workers {args.workers} needs PostgreSQL: SQLite allows one writer, so "
              "one server process serves it (set --database-url postgresql+psycopg://...)",
              file=sys.stderr)
        return EXIT_USAGE
    if args.policy:
        settings = settings.model_copy(update={"policy_file": Path(args.policy)})
    from numparity_server.analysis.policy import PolicyError
    from numparity_server.dashboard.manual import ManualError, manual_folder
    from numparity_server.kit.policy_file import load_policy

    try:
        load_policy(settings.policy_file)
        manual_folder(settings)
    except (PolicyError, ManualError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.migrate:
        _migrate(settings, "head")
    import uvicorn

    if args.workers == 1:
        from numparity_server.app import create_app

        uvicorn.run(create_app(settings), host=args.host, port=args.port,
                    log_level=args.log_level, timeout_graceful_shutdown=GRACEFUL_S)
        return EXIT_OK
    from numparity_server.kit.settings import worker_environment

    # The only settings that travel through the environment: uvicorn's worker processes
    # build their app from an import string (app.create_worker_app).
    os.environ.update(worker_environment(settings))
    metrics_dir = None
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        # prometheus_client's multiprocess mode: each worker writes its counters to files
        # there and a scrape of any worker sums them all. Set before the workers start:
        # prometheus_client reads it when a worker first imports it.
        import tempfile

        metrics_dir = tempfile.mkdtemp(prefix="numparity-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    try:
        uvicorn.run("numparity_server.app:create_worker_app", factory=True,
                    host=args.host, port=args.port, workers=args.workers,
                    log_level=args.log_level, timeout_graceful_shutdown=GRACEFUL_S)
    finally:
        if metrics_dir is not None:
            import shutil

            shutil.rmtree(metrics_dir, ignore_errors=True)
    return EXIT_OK


def _token(settings: Settings, args: argparse.Namespace) -> int:
    from numparity_server.auth import service
    from numparity_server.kit.db import session_factory
    from numparity_server.kit.errors import DomainError

    engine = _migrated_engine(settings)
    if engine is None:
        return EXIT_FAILED
    try:
        with session_factory(engine)() as session:
            if args.token_command == "create":
                created = service.create_token(session=session, role=args.role,
                                               label=args.label, node_names=args.node,
                                               node_patterns=args.node_pattern)
                print(created.token)
                print(f"created token {created.id} ({created.role}, {created.label!r}"
                      f"{_nodes_said(created)}); it is shown only once", file=sys.stderr)
            elif args.token_command == "list":
                _print_tokens(service.list_tokens(session=session))
            else:
                revoked = service.revoke_token(session=session, token_id=args.id)
                print(f"revoked token {revoked.id} ({revoked.role}, {revoked.label!r})")
    except DomainError as exc:
        print(f"error: {exc.detail}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        engine.dispose()
    return EXIT_OK


def _device(settings: Settings, args: argparse.Namespace) -> int:
    from numparity_server.kit.db import session_factory
    from numparity_server.kit.errors import DomainError
    from numparity_server.runs import moves

    engine = _migrated_engine(settings)
    if engine is None:
        return EXIT_FAILED
    try:
        with session_factory(engine)() as session:
            if args.device_command == "move":
                moved = moves.move_device(session=session, device=args.device,
                                          to_node=args.to)
                print(f"moved {moved.identity} from {moved.from_node or 'no node'} to "
                      f"{moved.to_node} ({moved.claimed_results} claimed results joined its "
                      "history)")
            else:
                for claim in moves.list_claims(session=session):
                    print(f"{claim.identity}\towner {claim.owner or '-'}\tclaimed by "
                          f"{claim.claimed_by} at {claim.slot}\t{claim.results} results\t"
                          f"last seen {claim.last_seen}")
    except DomainError as exc:
        print(f"error: {exc.detail}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        engine.dispose()
    return EXIT_OK


def _retention(settings: Settings, args: argparse.Namespace) -> int:
    from numparity_server.kit.db import session_factory
    from numparity_server.retention.service import apply_retention

    days = args.days if args.days is not None else settings.retention_days
    if days is None:
        print("retention is off (NUMPARITY_RETENTION_DAYS is unset and no --days): nothing "
              "dropped", file=sys.stderr)
        return EXIT_OK
    engine = _migrated_engine(settings)
    if engine is None:
        return EXIT_FAILED
    try:
        report = apply_retention(sessions=session_factory(engine), days=days,
                                 batch_size=args.batch_size, dry_run=args.dry_run)
    finally:
        engine.dispose()
    verb = "would drop" if report.dry_run else "dropped"
    print(f"{verb} {report.runs} runs ({report.results} results) received before "
          f"{report.cutoff:%Y-%m-%d %H:%M:%SZ}, {report.manifests} manifests, "
          f"{report.traces} op traces and {report.fingerprints} fingerprints no remaining "
          f"result references, {report.comparisons} kept comparisons, "
          f"{report.environments} environments nothing refers to, "
          f"{report.upload_parts} parts of uploads nobody finished within a day")
    return EXIT_OK


def _migrated_engine(settings: Settings) -> Engine | None:
    """An engine of a database at the newest schema; None (said on stderr) otherwise.

    A SQLite file that is not there is not created as a side effect of connecting.
    """
    from numparity_server.kit.db import create_engine_for
    from numparity_server.kit.migrate import current_revision, head_revision

    if _missing_sqlite_file(settings.database_url):
        print(f"error: database {_safe_url(settings)} does not exist: run "
              "`numparity-server migrate`", file=sys.stderr)
        return None
    engine = create_engine_for(settings, pooled=False)
    with engine.connect() as connection:
        revision = current_revision(connection)
    if revision != head_revision():
        engine.dispose()
        print(f"error: database {_safe_url(settings)} is not migrated (revision "
              f"{revision or 'none'}): run `numparity-server migrate`", file=sys.stderr)
        return None
    return engine


def _missing_sqlite_file(url: str) -> bool:
    """A SQLite file that is not there (connecting would create it as a side effect)."""
    from sqlalchemy import make_url

    parsed = make_url(url)
    database = parsed.database or ""
    return (parsed.get_backend_name() == "sqlite" and database not in ("", ":memory:")
            and not database.startswith("file:") and not Path(database).exists())


def _nodes_said(token: CreatedToken) -> str:
    if token.role != "agent":
        return ""
    bound = binding_text(token.node_names, token.node_patterns)
    return f", bound to {bound}" if bound else ", writes runs of any node"


def _nodes_column(token: TokenOut) -> str:
    if token.role != "agent":
        return "-"
    return binding_text(token.node_names, token.node_patterns) or "any node"


def _print_tokens(tokens: Sequence[TokenOut]) -> None:
    header = ("ID", "ROLE", "LABEL", "CREATED", "REVOKED", "NODES")
    rows = [header] + [
        (str(t.id), t.role, t.label or "-", t.created_at.strftime("%Y-%m-%d %H:%M:%SZ"),
         t.revoked_at.strftime("%Y-%m-%d %H:%M:%SZ") if t.revoked_at else "-",
         _nodes_column(t))
        for t in tokens
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        cells = (cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        print("  ".join(cells).rstrip())


def _demo(demo_args: Sequence[str]) -> int:
    try:
        from numparity_server import demo
    except ImportError as exc:
        print(f"error: the demo is not available: {exc}", file=sys.stderr)
        return EXIT_FAILED
    return int(demo.main(list(demo_args)) or 0)


if __name__ == "__main__":
    sys.exit(main())
