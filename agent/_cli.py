"""`numparity-agent`: a thin shell over the library (DESIGN §2.6).

Settings come from flags, then NUMPARITY_SERVER / NUMPARITY_TOKEN / NUMPARITY_NODE /
NUMPARITY_SPOOL. Exit codes:
  0 ok (uploaded, or written with --output / to stdout when no server is given)
  2 usage error (unknown workload or variant: the valid names are listed)
  3 the document is spooled: the server was unreachable or answered 5xx/408/429
  4 a variant failed (crash, timeout or exception); takes precedence over 3 and 5
  5 the server rejected the document (4xx); it was moved to the spool's rejected/
  1 doctor --strict: at least one check warned
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

from numparity_agent import _upload, _variants, _workloads
from numparity_agent._log import log

EXIT_OK = 0
EXIT_DOCTOR_WARNINGS = 1
EXIT_USAGE = 2
EXIT_SPOOLED = 3
EXIT_VARIANT_FAILED = 4
EXIT_REJECTED = 5


def _names(values: list[str] | None) -> list[str] | None:
    """Accept `--variants a b` as well as `--variants a,b`."""
    if not values:
        return None
    return [name for value in values for name in value.split(",") if name]


def _labels(values: list[str] | None) -> dict[str, str]:
    labels = {}
    for value in values or []:
        key, sep, val = value.partition("=")
        if not sep or not key:
            raise ValueError(f"--label expects key=value, got {value!r}")
        labels[key] = val
    return labels


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="numparity-agent",
        description="Run the numparity reference suite and upload its fingerprints.",
        epilog="exit codes: 0 ok, 2 usage, 3 spooled (server unreachable), "
        "4 a variant failed, 5 rejected by the server",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def server_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--server", help="server URL (or NUMPARITY_SERVER)")
        p.add_argument("--token", help="agent token (or NUMPARITY_TOKEN)")
        p.add_argument(
            "--spool",
            help="spool directory (or NUMPARITY_SPOOL; default ~/.local/state/numparity/spool)",
        )
        p.add_argument(
            "--upload-timeout",
            type=float,
            default=_upload.DEFAULT_TIMEOUT_S,
            help="seconds per upload request (default %(default)s)",
        )

    run = sub.add_parser("run", help="run the suite, spool and upload the run document")
    server_args(run)
    run.add_argument(
        "--variants",
        nargs="+",
        metavar="V",
        help=f"variants (default all: {', '.join(_variants.names())})",
    )
    run.add_argument(
        "--workloads",
        nargs="+",
        metavar="W",
        help=f"workloads: {', '.join(_workloads.builtin_names())} or "
        "module:factory (default all built-ins)",
    )
    run.add_argument("--device", default="cpu", help="cpu or cuda:N (default cpu)")
    run.add_argument("--repeats", type=int, default=2, help="runs per variant (default 2)")
    run.add_argument("--node", help="node name (or NUMPARITY_NODE; default the host name)")
    run.add_argument("--label", action="append", metavar="K=V", help="node label, repeatable")
    run.add_argument("--output", help="also write the run document to this file")
    run.add_argument(
        "--timeout",
        type=float,
        default=900.0,
        help="seconds per variant before its child is killed (default 900)",
    )
    run.add_argument(
        "--fault-drill",
        action="store_true",
        help="flip one bit of one activation per workload in the strict variant and mark "
        "the document as a drill: checks that the audit catches a corrupting GPU",
    )

    flush = sub.add_parser("flush", help="upload what is spooled, oldest first")
    server_args(flush)

    sub.add_parser("env", help="print the environment document")

    doctor = sub.add_parser("doctor", help="the reproducibility checklist of this node")
    doctor.add_argument("--json", action="store_true", help="print the checks as JSON")
    doctor.add_argument(
        "--strict", action="store_true", help="exit 1 when any check warns (default exit 0)"
    )
    return parser


def _write_atomic(path: str, document: dict[str, Any]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(document, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def _spool_dir(args: argparse.Namespace) -> Path:
    return Path(args.spool) if args.spool else _upload.default_spool_dir()


def _flush_code(outcomes: list[_upload.UploadOutcome]) -> int:
    if any(o.retry for o in outcomes):
        return EXIT_SPOOLED
    if any(not o.ok for o in outcomes):
        return EXIT_REJECTED
    return EXIT_OK


def _cmd_flush(args: argparse.Namespace) -> int:
    server = args.server or os.environ.get("NUMPARITY_SERVER")
    if not server:
        log("flush needs --server or NUMPARITY_SERVER")
        return EXIT_USAGE
    token = args.token or os.environ.get("NUMPARITY_TOKEN")
    spool = _spool_dir(args)
    outcomes = _upload.flush(spool, server=server, token=token, timeout=args.upload_timeout)
    if not outcomes:
        log(f"nothing spooled in {spool}")
    return _flush_code(outcomes)


def _cmd_run(args: argparse.Namespace) -> int:
    from numparity_agent._suite import UsageError, run_suite, validate

    variants = _names(args.variants) or _variants.names()
    workloads = _names(args.workloads) or _workloads.builtin_names()
    try:
        validate(workloads, variants, args.repeats, drill=args.fault_drill)
        labels = _labels(args.label)
    except (UsageError, ValueError) as exc:
        log(f"usage: {exc}")
        return EXIT_USAGE
    server = args.server or os.environ.get("NUMPARITY_SERVER")
    token = args.token or os.environ.get("NUMPARITY_TOKEN")
    node = args.node or os.environ.get("NUMPARITY_NODE") or socket.gethostname()
    spool = _spool_dir(args)
    if server and _upload.spooled(spool):
        _upload.flush(spool, server=server, token=token, timeout=args.upload_timeout)

    document = run_suite(
        workloads=workloads,
        variants=variants,
        device=args.device,
        repeats=args.repeats,
        node=node,
        labels=labels,
        timeout=args.timeout,
        drill=args.fault_drill,
    )
    failed = [r for r in document["results"] if r["status"] == "failed"]
    code = EXIT_OK
    if args.output:
        _write_atomic(args.output, document)
        log(f"wrote {args.output}")
    if server:
        path = _upload.spool_document(document, spool)
        outcome = _upload.send_spooled(
            path, server=server, token=token, timeout=args.upload_timeout
        )
        if not outcome.ok:
            code = EXIT_SPOOLED if outcome.retry else EXIT_REJECTED
    elif not args.output:
        json.dump(document, sys.stdout, indent=1)
        sys.stdout.write("\n")
    if failed:
        log(f"{len(failed)} result(s) failed")
        code = EXIT_VARIANT_FAILED
    return code


def _cmd_env(_args: argparse.Namespace) -> int:
    from numparity_agent._environment import capture_environment

    json.dump(capture_environment(), sys.stdout, indent=1)
    sys.stdout.write("\n")
    return EXIT_OK


def _cmd_doctor(args: argparse.Namespace) -> int:
    from numparity_agent._doctor import as_json, diagnose, render
    from numparity_agent._environment import capture_environment

    environment = capture_environment()
    checks = diagnose(environment=environment)
    if args.json:
        json.dump(as_json(checks), sys.stdout, indent=1)
    else:
        sys.stdout.write(render(checks, environment))
    sys.stdout.write("\n")
    if args.strict and any(c.status == "warn" for c in checks):
        return EXIT_DOCTOR_WARNINGS
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on usage errors, 0 on --help
        return int(exc.code or 0)
    handlers = {"run": _cmd_run, "flush": _cmd_flush, "env": _cmd_env, "doctor": _cmd_doctor}
    return handlers[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
