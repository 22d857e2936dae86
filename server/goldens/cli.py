"""``numparity-server golden pin|unpin|list|show`` (design §3.11): the same services as
``POST /api/v1/goldens`` and its reads, for an admin at the server's database."""

from __future__ import annotations

import argparse
import getpass
import socket
import sys
from collections.abc import Callable

from pydantic import ValidationError
from sqlalchemy import Engine

from numparity_server.goldens import service
from numparity_server.goldens.schemas import GoldenOut, PinIn
from numparity_server.kit.errors import DomainError

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def add_commands(commands: argparse._SubParsersAction,  # type: ignore[type-arg]
                 common: argparse.ArgumentParser) -> None:
    golden = commands.add_parser(
        "golden", help="pin the lab's reference answers (goldens): pin, unpin, list, show")
    actions = golden.add_subparsers(dest="golden_command", required=True, metavar="ACTION")
    pin = actions.add_parser(
        "pin", parents=[common],
        help="pin a device model's answers on an environment or a software stack",
        description="Pin the answers of a device model on an environment's software stack "
                    "(torch, CUDA, cuDNN; on the CPU also its model) or on one environment, "
                    "from the fleet's current majority or from one run. Each pin of the same "
                    "suite, model and scope is a new version; the newest is in force.")
    source = pin.add_mutually_exclusive_group(required=True)
    source.add_argument("--from-majority", action="store_true",
                        help="per workload and variant, the answer more than half of the "
                             "devices in scope give now")
    source.add_argument("--from-run", metavar="RUN_ID", help="the answers of one run")
    pin.add_argument("--device", metavar="SLOT",
                     help="--from-run: the run's device (default its first of --model)")
    where = pin.add_mutually_exclusive_group()
    where.add_argument("--env-key", metavar="KEY",
                       help="--from-majority: the environment whose stack is pinned")
    where.add_argument("--node", metavar="NAME",
                       help="--from-majority: the node whose current environment is meant")
    pin.add_argument("--model", metavar="MODEL",
                     help="the device model: cpu, cuda/NAME/CC (default the run's device's, "
                          "or the environment's only one)")
    pin.add_argument("--scope", choices=["stack", "environment"], default="stack",
                     help="stack (default): the model with that stack, every environment "
                          "that has it; environment: that env_key alone")
    pin.add_argument("--match", action="append", default=[], metavar="ATTR=VALUE",
                     help="a stack attribute to add or override (driver=550.54.15, "
                          "cpu_capability=AVX2; ATTR= for none); repeatable")
    pin.add_argument("--suite", default="standard",
                     help="the suite whose answers are pinned (default %(default)s)")
    pin.add_argument("--workloads", nargs="+", metavar="W", help="only these workloads")
    pin.add_argument("--variants", nargs="+", metavar="V", help="only these variants")
    pin.add_argument("--reason", required=True, help="why: shown wherever the pin is used")
    pin.add_argument("--by", metavar="WHO",
                     help="who pins (default user@host of this shell)")
    pin.add_argument("--json", action="store_true", help="print the pin as JSON")

    unpin = actions.add_parser("unpin", parents=[common],
                               help="unpin: a new version of the pin without answers")
    unpin.add_argument("id", type=int, help="a version's id of the pin (golden list)")
    unpin.add_argument("--reason", required=True, help="why: kept with the new version")
    unpin.add_argument("--by", metavar="WHO",
                       help="who unpins (default user@host of this shell)")

    listing = actions.add_parser("list", parents=[common], help="every version, newest first")
    listing.add_argument("--in-force", action="store_true", help="only the versions in force")
    listing.add_argument("--suite", help="only the pins of this suite")
    listing.add_argument("--model", metavar="MODEL", help="only the pins of this device model")
    listing.add_argument("--json", action="store_true", help="print the versions as JSON")

    show = actions.add_parser("show", parents=[common], help="one version with its answers")
    show.add_argument("id", type=int, help="a version's id (golden list)")
    show.add_argument("--json", action="store_true", help="print the version as JSON")


def _who(args: argparse.Namespace) -> str:
    if args.by:
        return str(args.by)
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (a container's uid)
        user = "unknown"
    return f"{user}@{socket.gethostname()} (cli)"


def _match(items: list[str]) -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ValueError(f"--match {item!r}: write ATTR=VALUE (ATTR= for none)")
        found[name] = value or None
    return found


def run(engine_of: Callable[[], Engine | None], args: argparse.Namespace) -> int:
    from numparity_server.kit.db import session_factory

    try:
        request = _request(args) if args.golden_command == "pin" else None
    except (ValueError, ValidationError) as exc:
        print(f"usage: {exc}", file=sys.stderr)
        return EXIT_USAGE
    engine = engine_of()
    if engine is None:
        return EXIT_FAILED
    try:
        with session_factory(engine)() as session:
            if request is not None:
                shown = service.pin(session=session, request=request, pinned_by=_who(args))
            elif args.golden_command == "unpin":
                shown = service.unpin(session=session, golden_id=args.id,
                                      reason=args.reason, pinned_by=_who(args))
            elif args.golden_command == "show":
                shown = service.get_pin(session=session, golden_id=args.id)
            else:
                page = service.list_pins(session=session, suite=args.suite, model=args.model,
                                         in_force=args.in_force, limit=10_000, offset=0)
                if args.json:
                    print(page.model_dump_json(indent=1))
                else:
                    print(f"{'ID':>4} {'VER':>3} {'STATE':9} {'MODEL':24} {'SCOPE':40} "
                          f"{'ANSWERS':>7} {'PINNED_AT':20} BY: REASON")
                    for item in page.items:
                        print(_line(item))
                return EXIT_OK
    except DomainError as exc:
        print(f"error: {_detail(exc)}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        engine.dispose()
    if getattr(args, "json", False):
        print(shown.model_dump_json(indent=1))
    else:
        _print(shown)
    return EXIT_OK


def _request(args: argparse.Namespace) -> PinIn:
    return PinIn.model_validate({
        "source": "majority" if args.from_majority else "run", "reason": args.reason,
        "suite": args.suite, "run_id": args.from_run, "device": args.device,
        "model": args.model, "env_key": args.env_key, "node": args.node,
        "scope": args.scope, "match": _match(args.match), "workloads": args.workloads,
        "variants": args.variants})


def _detail(exc: DomainError) -> str:
    if isinstance(exc.detail, list):
        return "; ".join(f"{'.'.join(str(p) for p in e['loc'][1:])}: {e['msg']}"
                         for e in exc.detail)
    return str(exc.detail)


def _state(item: GoldenOut) -> str:
    return "unpinned" if item.retired else ("in force" if item.in_force else "replaced")


def _line(item: GoldenOut) -> str:
    return (f"{item.id:>4} {item.version:>3} {_state(item):9} {item.model[:24]:24} "
            f"{item.scope_text[:40]:40} {item.answers_count:>7} "
            f"{item.pinned_at.strftime('%Y-%m-%dT%H:%M:%SZ'):20} {item.pinned_by}: "
            f"{item.reason}")


def _print(item: GoldenOut) -> None:
    what = "unpinned" if item.retired else "pinned"
    print(f"pin {item.id}: version {item.version} of {item.suite} {item.model} on "
          f"{item.scope_text} ({_state(item)}), {what} by {item.pinned_by} at "
          f"{item.pinned_at.isoformat()}: {item.reason}")
    if item.source == "run":
        print(f"  from run {item.source_run_id}, device {item.source_device}")
    elif item.source == "majority":
        print("  from the fleet's majority")
    for answer in item.answers or []:
        print(f"  {answer.workload}/{answer.variant} v{answer.workload_version}: "
              f"{answer.manifest_hash[:16]} ({answer.holders} of {answer.devices} device(s))")
    for left in item.left_out or []:
        print(f"  not pinned: {left.workload}/{left.variant}: {left.reason}")
