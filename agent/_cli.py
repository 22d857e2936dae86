"""`numparity-agent`: a thin shell over the library (design §2.6).

Settings come from the command line, then NUMPARITY_* variables, then the config file
(`_config`). `run` and `flush` hold the spool's lock (`_lock`) while they work. The exit
codes are EXIT_CODES_HELP below (also printed by --help and listed in docs/reference/exit-codes.md).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import ssl
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from numparity_agent import (
    _compile,
    _config,
    _devices,
    _flush,
    _preflight,
    _spool,
    _upload,
    _values,
    _variants,
    _workloads,
)
from numparity_agent._answer import server_message, tls_verify
from numparity_agent._drill_spec import DrillSpecError, parse_drill
from numparity_agent._forkserver import ForkServer
from numparity_agent._lock import LockBusy, spool_lock
from numparity_agent._log import end_progress, hide, interactive, log, progress

if TYPE_CHECKING:
    from numparity_agent._suite import Progress

EXIT_OK = 0
EXIT_DOCTOR_WARNINGS = 1
EXIT_USAGE = 2
EXIT_SPOOLED = 3
EXIT_VARIANT_FAILED = 4
EXIT_REFUSED = 5
EXIT_SPOOL_UNWRITABLE = 6
EXIT_LOCKED = 7
EXIT_QUARANTINED = 8
# stdout closed before the output was written (`doctor | head -1`): what a shell reports
# for a command killed by SIGPIPE (128 + 13), as `yes | head -1` ends.
EXIT_BROKEN_PIPE = 141
# When several apply, the first of these wins: what needs a person most comes first;
# 3 last, as the agent retries it by itself.
# A misconfigured node (2) first: nothing it sends can arrive until a person fixes it.
PRECEDENCE = (EXIT_USAGE, EXIT_SPOOL_UNWRITABLE, EXIT_VARIANT_FAILED, EXIT_REFUSED,
              EXIT_QUARANTINED, EXIT_SPOOLED)

EXIT_CODES_HELP = """\
exit codes:
  0  ok: uploaded (or written with --output, or printed when no server is set)
  1  doctor --strict: a check warned (something this node can fix; facts
     about every process or the format never fail it)
  2  misconfigured: a bad option, config key or value, unknown workload,
     variant or device (the message lists the visible ones); a server URL
     that is not numparity's API (no scheme, a 404, another web server).
     Found before the suite runs where it can be; a run made already stays
     in the spool
  3  spooled: the server was unreachable, busy (5xx, 408, 429) or its TLS
     certificate could not be verified; the next run or flush sends it
  4  a variant failed (crash, timeout, exception) on a device; the rest is
     still uploaded. Also: the devices could not be listed (nothing ran)
  5  refused by the server: 401/403, the token (unknown, revoked, without the
     agent role: `run` asks before its suite and runs nothing; a document
     stays spooled), or another 4xx, or a token bound to another node (the
     document is moved to <spool>/rejected/ with a .reason; `numparity-agent
     spool` lists it)
  6  the spool (or --output) could not be written (disk full, read-only, no
     permission); the run is then uploaded directly, lost only if that fails too
  7  another numparity-agent holds the spool's lock: nothing was done
  8  a spool file was not a run document: moved to <spool>/quarantine/
  141 stdout was closed early (`doctor | head -1`): the rest was not printed
  when several apply, the first of 2, 6, 4, 5, 8, 3 wins"""

MEANING = {
    EXIT_OK: "ok", EXIT_USAGE: "misconfigured (the run, if any, stays in the spool)",
    EXIT_SPOOLED: "kept in the spool for the next run",
    EXIT_VARIANT_FAILED: "a variant failed", EXIT_REFUSED: "refused by the server",
    EXIT_SPOOL_UNWRITABLE: "the spool could not be written",
    EXIT_QUARANTINED: "a spool file was quarantined",
}

# Sleeps of --jitter and of the upload backoff go through here (tests replace it).
sleep = time.sleep


def _parser() -> argparse.ArgumentParser:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog="numparity-agent",
        description="Run the numparity reference suite and upload its fingerprints.",
        epilog=EXIT_CODES_HELP,
        formatter_class=formatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def server_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--config", metavar="FILE",
                       help="TOML config file (or NUMPARITY_CONFIG; default "
                       f"{_config.DEFAULT_CONFIG} when it exists)")
        p.add_argument("--server", help="server URL (NUMPARITY_SERVER, config server)")
        p.add_argument("--token", help="agent token (NUMPARITY_TOKEN, config token); "
                       "visible in ps: prefer --token-file")
        p.add_argument("--token-file", metavar="FILE",
                       help="file holding the agent token (NUMPARITY_TOKEN_FILE, "
                       "config token_file)")
        p.add_argument("--spool", metavar="DIR",
                       help="spool folder (NUMPARITY_SPOOL, config spool; default "
                       "$XDG_STATE_HOME or ~/.local/state, then numparity/spool)")
        p.add_argument("--upload-timeout", metavar="S",
                       help="seconds per upload request (NUMPARITY_UPLOAD_TIMEOUT, config "
                       f"upload_timeout; default {_upload.DEFAULT_TIMEOUT_S:g})")
        p.add_argument("--max-wait", metavar="S",
                       help="retry an unreachable or busy server with backoff for at most S "
                       "seconds without progress (an upload that moves forward goes on), "
                       "then leave the rest spooled (NUMPARITY_MAX_WAIT, config "
                       f"max_wait; default {_flush.DEFAULT_MAX_WAIT_S:g}; 0: no retries)")
        p.add_argument("--ca-bundle", metavar="FILE",
                       help="PEM file with the CA that signed the server's certificate, "
                       "for a lab's own CA (NUMPARITY_CA_BUNDLE, config ca_bundle; default "
                       "the usual public CAs)")

    run = sub.add_parser("run", help="run the suite, spool and upload the run document",
                         epilog=EXIT_CODES_HELP, formatter_class=formatter)
    server_args(run)
    run.add_argument("--suite", metavar="NAME",
                     help=f"the suite: {', '.join(_workloads.suite_names())} (production "
                     "shapes for GPU nodes; `numparity-agent suites` lists both) "
                     f"(NUMPARITY_SUITE, config suite; default {_workloads.SUITE})")
    run.add_argument("--variants", nargs="+", metavar="V",
                     help=f"variants (NUMPARITY_VARIANTS, config variants; default all: "
                     f"{', '.join(v for v in _variants.names() if v not in _variants.OPT_IN)};"
                     f" {', '.join(sorted(_variants.OPT_IN))} (torch.compile) only when "
                     f"named; {_workloads.LARGE} leaves out fp64-reference unless named)")
    run.add_argument("--compile-cache", metavar="DIR",
                     help="Inductor's cache folder for the compiled variant, kept between "
                     "runs (NUMPARITY_COMPILE_CACHE, config compile_cache; default the "
                     "node's TORCHINDUCTOR_CACHE_DIR, else $XDG_STATE_HOME or "
                     "~/.local/state, then numparity/inductor)")
    run.add_argument("--workloads", nargs="+", metavar="W",
                     help=f"workloads of the suite: {', '.join(_workloads.builtin_names())} "
                     "or module:factory (NUMPARITY_WORKLOADS, config workloads; default all "
                     "built-ins of the suite)")
    run.add_argument("--device", metavar="LIST",
                     help="devices, comma-separated: cuda:N, cpu, or all (every visible CUDA "
                     "device, MIG instances included, else the CPU); they run at once "
                     "(NUMPARITY_DEVICE, config device; default all)")
    run.add_argument("--repeats", metavar="N",
                     help="runs per variant (NUMPARITY_REPEATS, config repeats; default 2)")
    run.add_argument("--node", metavar="NAME",
                     help="node name (NUMPARITY_NODE, config node; default the host name)")
    run.add_argument("--label", action="append", metavar="K=V",
                     help="node label, repeatable (NUMPARITY_LABELS='k=v,k=v', config "
                     "[labels])")
    run.add_argument("--output", metavar="FILE",
                     help="also write the run document to this file")
    run.add_argument("--timeout", metavar="S",
                     help="seconds per variant before its child is killed (NUMPARITY_TIMEOUT, "
                     "config timeout; default 900)")
    run.add_argument("--jitter", metavar="S",
                     help="first wait a random 0..S seconds, to spread a fleet's cron jobs "
                     "(NUMPARITY_JITTER, config jitter; default 0)")
    run.add_argument("--trace-ops", action="store_true", default=None,
                     help="also record every aten op of each workload with the hashes of "
                     "its inputs and outputs, so the server can name the op where two "
                     "environments part (NUMPARITY_TRACE_OPS, config trace_ops; default "
                     "off; a steady node uploads no trace twice)")
    run.add_argument("--study-budget", metavar="S",
                     help="seconds a traced nondeterministic result's cost study may time "
                     "rounds for, after its first six: it stops earlier once its intervals "
                     "are narrow (NUMPARITY_STUDY_BUDGET, config study_budget; default 60)")
    run.add_argument("--fresh-interpreters", action="store_true",
                     help="start each variant's child process in a fresh interpreter, "
                     "which imports torch again, instead of forking it from a server "
                     "that imported torch once (default: forked, where its environment "
                     "allows)")
    run.add_argument("--fault-drill", nargs="?", const=True, default=False,
                     metavar="op[:SPEC]",
                     help="flip one bit of one activation per workload in the strict variant "
                     "and mark the document as a drill: checks that the audit catches a "
                     "corrupting GPU; with op[:SPEC], corrupt an op's output as it is "
                     "computed instead (SPEC: a class matmul|conv|reduction|elementwise|"
                     "attention|collective, seed=N, call=N, element=N, "
                     "bit=sign|exponent|mantissa|N, bits=K, stuck)")
    run.add_argument("--drill-device", metavar="SLOT",
                     help="with --fault-drill: the one device whose strict results are "
                     "corrupted, e.g. cuda:3 (default the first device of the run)")

    explain = sub.add_parser(
        "explain", help="find the setting under which this node gives another run's bits "
        "(or, --target eager, under which its compiled results give eager's)",
        epilog=EXIT_CODES_HELP, formatter_class=formatter)
    server_args(explain)
    explain.add_argument("--against", metavar="RUN_ID", required=True,
                         help="the run whose bits to reproduce (a run_id of GET /runs)")
    explain.add_argument("--target", choices=("run", "eager"), default="run",
                         help="run: the bits of RUN_ID's results (default); eager: for "
                         "each compiled result of RUN_ID (a run of this node with the "
                         "default and compiled variants), the Inductor setting under "
                         "which torch.compile gives that run's eager (default) bits")
    explain.add_argument("--workloads", nargs="+", metavar="W",
                         help="only these workloads (default every one of the run)")
    explain.add_argument("--variants", nargs="+", metavar="V",
                         help="only these variants (default every one of the run but "
                         "fp64-reference; with --target eager, every compiled one)")
    explain.add_argument("--device", metavar="SLOT",
                         help="this node's device to compute on (default cpu, or cuda:0 "
                         "where there is a GPU) and the reference's results to take (its "
                         "results on the same slot, else its first device)")
    explain.add_argument("--node", metavar="NAME",
                         help="this node's name (NUMPARITY_NODE, config node; default the "
                         "host name)")
    explain.add_argument("--max-candidates", metavar="N", type=int,
                         default=_explain_defaults()[0],
                         help="settings to try at most (default %(default)s)")
    explain.add_argument("--max-seconds", metavar="S", type=float,
                         default=_explain_defaults()[1],
                         help="stop trying after S seconds (default %(default)s)")
    explain.add_argument("--output", metavar="FILE",
                         help="also write the findings to this file")

    check = sub.add_parser(
        "check", help="go/no-go before a job: this node's devices against the pinned (or "
        "fleet) answers, within --max-seconds",
        description="Compute a few answers the server expects (the pin in force for each "
        "device model on this environment, else the fleet's majority here) on every device "
        "at once, and say go or no-go, one line per device. Nothing is spooled or uploaded.",
        epilog=_check_help(), formatter_class=formatter)
    server_args(check)
    check.add_argument("--device", metavar="LIST",
                       help="devices to check, comma-separated, or all (NUMPARITY_DEVICE, "
                       "config device; default all: every visible GPU, else the CPU)")
    check.add_argument("--suite", metavar="NAME",
                       help=f"the suite (NUMPARITY_SUITE, config suite; default "
                       f"{_workloads.SUITE})")
    check.add_argument("--workloads", dest="check_workloads", nargs="+", metavar="W",
                       help="only these workloads (default: those the server chooses: "
                       "pinned, split in the fleet, recording layers, within the budget)")
    check.add_argument("--variants", dest="check_variants", nargs="+", metavar="V",
                       help="only these variants: the server chooses the workloads among "
                       "them (default: any, strict first)")
    check.add_argument("--max-seconds", metavar="S", type=float,
                       default=_check_default_seconds(),
                       help="never take longer than this, whatever happens (default "
                       "%(default)g)")
    fail = check.add_mutually_exclusive_group()
    fail.add_argument("--fail-open", dest="check_fail", action="store_const", const="open",
                      help="exit 0 when the check cannot tell (server unreachable or "
                      "refusing the token, unknown environment, out of time); a device "
                      "that differs or fails still exits 10 or 13 (NUMPARITY_CHECK_FAIL, "
                      "config check_fail)")
    fail.add_argument("--fail-closed", dest="check_fail", action="store_const",
                      const="closed", help="exit with the cause's code then (the default)")
    check.add_argument("--json", action="store_true",
                       help="print the verdicts as one JSON object")
    check.add_argument("--fault-drill", nargs="?", const=True, default=False,
                       metavar="op[:SPEC]",
                       help="flip one bit in the strict variant on one device (a corrupting "
                       "GPU): that device must fail the check; with op[:SPEC], corrupt an "
                       "op's output as it is computed instead (as run --fault-drill)")
    check.add_argument("--drill-device", metavar="SLOT",
                       help="with --fault-drill: the device corrupted (default the first)")

    flush = sub.add_parser("flush", help="upload what is spooled, oldest first",
                           epilog=EXIT_CODES_HELP, formatter_class=formatter)
    server_args(flush)

    spool = sub.add_parser(
        "spool", help="list what waits in the spool and why; send a refused run again or "
        "delete it", epilog=EXIT_CODES_HELP, formatter_class=formatter,
        description="Without an action: every document waiting in the spool, refused by "
        "the server (rejected/) or not a run (quarantine/), each with its reason. resend "
        "puts refused runs back and flushes; drop deletes documents.")
    server_args(spool)
    spool.add_argument("action", nargs="?", choices=["list", "resend", "drop"],
                       default="list", help="list (default), resend or drop")
    spool.add_argument("names", nargs="*", metavar="NAME",
                       help="documents by file name or run_id, as the list shows them")

    repro = sub.add_parser(
        "repro", help="write a script that reproduces a compiled result's difference from "
        "eager in a fresh process",
        description="From a run document (run --output FILE) with the compiled variant: a "
        "standalone Python script that runs the module the run localised (else the whole "
        "model) in eager and through torch.compile on the run's own inputs and weights, "
        "and asserts the same bits; it fails where the run found a difference.")
    repro.add_argument("run_document", metavar="RUN.json", help="the run document")
    repro.add_argument("--workload", required=True, metavar="W", help="the workload")
    repro.add_argument("--variant", default=_variants.COMPILED_VARIANT, metavar="V",
                       help=f"the compiled variant (default {_variants.COMPILED_VARIANT})")
    repro.add_argument("--device", metavar="SLOT",
                       help="the result's device (default: the workload's first result)")
    repro.add_argument("--output", metavar="FILE",
                       help="where to write the script (default repro_<workload>_<variant>.py)")

    sub.add_parser("suites", help="list the suites, their workloads and, for large, each "
                   "workload's FLOPs and A100 time estimate")

    sub.add_parser("env", help="print the environment document")

    doctor = sub.add_parser("doctor", help="the reproducibility checklist of this node")
    doctor.add_argument("--json", action="store_true", help="print the checks as JSON")
    doctor.add_argument(
        "--pipeline", metavar="MODULE:FACTORY",
        help="also measure this DataLoader factory (a DataLoader, or a dataset and its "
        "settings) with real workers: whether it needs the seeds' recipe")
    doctor.add_argument(
        "--recipe", metavar="FILE",
        help="print, as Python to paste, how to make only the nondeterministic ops of a "
        "run document (run --trace-ops --repeats 2 --output FILE) deterministic, instead "
        "of the checklist")
    doctor.add_argument(
        "--strict", action="store_true",
        help="exit 1 when a check warns, i.e. finds something this node can fix (facts "
        "never fail it; default exit 0)",
    )
    return parser


def _check_help() -> str:
    from numparity_agent._check import CHECK_EXIT_CODES_HELP

    return CHECK_EXIT_CODES_HELP


def _check_default_seconds() -> float:
    from numparity_agent._check import DEFAULT_MAX_SECONDS

    return DEFAULT_MAX_SECONDS


def _explain_defaults() -> tuple[int, float]:
    from numparity_agent._explain import DEFAULT_MAX_CANDIDATES, DEFAULT_MAX_SECONDS

    return DEFAULT_MAX_CANDIDATES, DEFAULT_MAX_SECONDS


def worst(codes: set[int]) -> int:
    """The exit code when several apply (PRECEDENCE)."""
    return next((code for code in PRECEDENCE if code in codes), EXIT_OK)


class _Usage(Exception):
    """A usage error already worded for the operator."""


class _StdoutClosed(Exception):
    """The reader of stdout went away (`doctor | head -1`)."""


def _answer(text: str) -> None:
    """Print a command's answer on stdout, ending quietly when the reader leaves early."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()  # now, not at exit, so that a closed pipe is caught here
    except BrokenPipeError:
        # As `cat` ends: no traceback. stdout goes to /dev/null so that Python's own
        # flush at exit does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise _StdoutClosed from None


class _Context:
    """The settings `run` and `flush` share, resolved once."""

    def __init__(self, args: argparse.Namespace) -> None:
        cli = {key: getattr(args, key, None) for key in _config.KINDS}
        cli["labels"] = getattr(args, "label", None)
        try:
            self.settings = _config.resolve(cli, os.environ, args.config)
        except _config.ConfigError as exc:
            raise _Usage(str(exc)) from None
        get = self.settings.get
        self.server: str | None = get("server")
        self.token: str | None = get("token")
        hide(self.token)
        for warning in self.settings.warnings:
            log(f"warning: {warning}")
        self._spool: Path | None = get("spool")
        self.upload_timeout: float = get("upload_timeout", _upload.DEFAULT_TIMEOUT_S)
        self.max_wait: float = get("max_wait", _flush.DEFAULT_MAX_WAIT_S)
        ca_bundle = get("ca_bundle")
        try:
            self.verify = tls_verify(ca_bundle)
        except (OSError, ssl.SSLError) as exc:
            where = self.settings.sources.get("ca_bundle", "--ca-bundle")
            raise _Usage(f"cannot use {where} {ca_bundle} as a CA bundle: "
                         f"{getattr(exc, 'strerror', None) or exc}") from None

    @property
    def spool(self) -> Path:
        """The spool folder (the default one only when needed: `run --output` without a
        server must work where no home folder is)."""
        if self._spool is None:
            try:
                self._spool = _spool.default_spool_dir()
            except RuntimeError as exc:
                raise _Usage(str(exc)) from None
        return self._spool

    def flush(self) -> _flush.FlushResult:
        assert self.server
        return _flush.flush_spool(
            self.spool, server=self.server, token=self.token, timeout=self.upload_timeout,
            max_wait=self.max_wait, sleep=lambda s: sleep(s), verify=self.verify)

    def lock(self, stack: ExitStack, command: str) -> int | None:
        """Take the spool's lock for the rest of `stack`; an exit code when we must stop."""
        try:
            previous = stack.enter_context(spool_lock(self.spool, command))
        except LockBusy as exc:
            log(f"error: {exc}; this {command} does nothing (exit {EXIT_LOCKED})")
            return EXIT_LOCKED
        except OSError as exc:
            reason = f"{exc.strerror or exc}" + (f" ({exc.filename})" if exc.filename else "")
            if command == "flush":
                log(f"error: cannot lock the spool {self.spool}: {reason}")
                return EXIT_SPOOL_UNWRITABLE
            log(f"warning: cannot lock the spool {self.spool}: {reason}; running without "
                "the lock")
            return None
        if previous:
            log(f"took over the spool's lock from a numparity-agent that is gone ({previous})")
        return None


def _flush_codes(result: _flush.FlushResult, *, retryable: bool = True) -> set[int]:
    codes = set()
    if result.misconfigured:
        codes.add(EXIT_USAGE)
    if result.spool_errors:
        codes.add(EXIT_SPOOL_UNWRITABLE)
    if result.refused or result.rejected:
        codes.add(EXIT_REFUSED)
    if result.quarantined:
        codes.add(EXIT_QUARANTINED)
    if retryable and result.kept:
        codes.add(EXIT_SPOOLED)
    return codes


def _finish(codes: set[int]) -> int:
    code = worst(codes)
    others = sorted(codes - {code}, key=PRECEDENCE.index)
    also = f" (also: {', '.join(f'{c} {MEANING[c]}' for c in others)})" if others else ""
    log(f"exit {code}: {MEANING[code]}{also}")
    return code


def _cmd_flush(args: argparse.Namespace) -> int:
    context = _Context(args)
    if not context.server:
        log("usage: flush needs --server (or NUMPARITY_SERVER, or server in the config file)")
        return EXIT_USAGE
    with ExitStack() as stack:
        stopped = context.lock(stack, "flush")
        if stopped is not None:
            return stopped
        result = context.flush()
    if not (result.outcomes or result.quarantined or result.spool_errors):
        log(f"nothing spooled in {context.spool}")
        return EXIT_OK
    log(f"spool {context.spool}: {result.summary()}")
    return _finish(_flush_codes(result))


def _cmd_spool(args: argparse.Namespace) -> int:
    """`spool [list|resend|drop] NAME...`: the spool's documents and their reasons."""
    from numparity_agent import _spool_admin

    context = _Context(args)
    folder = context.spool
    if args.action == "list":
        if args.names:
            raise _Usage("spool list takes no names")
        _answer(_spool_admin.render(_spool_admin.entries(folder), folder))
        return EXIT_OK
    if not args.names:
        raise _Usage(f"spool {args.action} needs the documents' names (or run_ids), as "
                     "`numparity-agent spool` lists them")
    if args.action == "resend" and not context.server:
        raise _Usage("spool resend needs --server (or NUMPARITY_SERVER, or server in the "
                     "config file)")
    with ExitStack() as stack:
        stopped = context.lock(stack, "flush")
        if stopped is not None:
            return stopped
        try:
            chosen = _spool_admin.find(folder, args.names)
            for entry in chosen:
                if args.action == "drop":
                    _spool_admin.drop(entry)
                    log(f"dropped {entry.state} {entry.path.name}")
                else:
                    log(f"back in the spool: {_spool_admin.resend(entry, folder).name}")
        except _spool_admin.SpoolEntryError as exc:
            raise _Usage(str(exc)) from None
        except OSError as exc:
            log(f"error: cannot change the spool {folder}: {exc.strerror or exc}")
            return EXIT_SPOOL_UNWRITABLE
        if args.action == "drop":
            return EXIT_OK
        result = context.flush()
    log(f"spool {folder}: {result.summary()}")
    return _finish(_flush_codes(result))


def _cmd_explain(args: argparse.Namespace) -> int:
    """`explain --against RUN_ID` (design §2.11): read the reference, try settings in
    children, print and upload the findings."""
    from numparity_agent import _explain
    from numparity_agent._document import utc_now

    context = _Context(args)
    if not context.server:
        raise _Usage("explain needs --server (or NUMPARITY_SERVER, or server in the config "
                     "file): it reads the reference run there")
    if args.max_candidates < 1 or not args.max_seconds > 0:
        raise _Usage("--max-candidates must be at least 1 and --max-seconds more than 0")
    bad = [v for v in args.variants or () if v not in _variants.VARIANTS]
    if bad:
        raise _Usage(f"unknown variant(s) {', '.join(bad)}; valid: "
                     f"{', '.join(_variants.names())}")
    eager = args.target == _explain.TARGET_EAGER
    not_compiled = [v for v in args.variants or () if not _variants.get(v).compiles]
    if eager and not_compiled:
        raise _Usage(f"--target eager explains compiled results; {', '.join(not_compiled)} "
                     "does not compile (try --variants compiled)")
    device = args.device or _default_explain_device()
    with httpx.Client(timeout=context.upload_timeout, verify=context.verify) as client:
        answer, reference = _explain.fetch_reference(
            client, context.server, context.token, args.against)
        if reference is None:
            log(f"error: cannot read run {args.against}: {server_message(answer.detail)}")
            return _finish({EXIT_USAGE if answer.status == 404 else
                            EXIT_REFUSED if answer.refused else EXIT_SPOOLED})
        try:
            if eager:
                targets = _explain.eager_targets_of(reference, workloads=args.workloads,
                                                    variants=args.variants)
            else:
                targets = _explain.targets_of(reference, workloads=args.workloads,
                                              variants=args.variants, device=None)
        except _explain.ExplainError as exc:
            raise _Usage(str(exc)) from None
        targets = _explain.on_device(targets, device)
        started = utc_now()
        explained = _explain.explain(reference, targets, device=device,
                                     max_candidates=args.max_candidates,
                                     max_seconds=args.max_seconds,
                                     compile_cache=_compile_cache(context.settings))
        findings = explained.findings
        for finding in findings:
            _answer(finding.sentence(args.against) + "\n")
        document = _explain.explanation_document(
            explained, node=context.settings.get("node") or socket.gethostname(),
            against=args.against, device=device, started_at=started, finished_at=utc_now(),
            target=args.target)
        codes: set[int] = set()
        if args.output:
            try:
                _write_output(args.output, document)
            except OSError as exc:
                log(f"error: cannot write {args.output}: {exc.strerror or exc}")
                codes.add(EXIT_SPOOL_UNWRITABLE)
        sent = _explain.post_findings(client, context.server, context.token, document)
        if sent.ok:
            log(f"findings uploaded to {context.server}")
        else:
            log(f"error: the findings were not uploaded: {server_message(sent.detail)}")
            codes.add(EXIT_REFUSED if sent.status is not None and sent.status < 500
                      else EXIT_SPOOLED)
    if any(f.status == "failed" for f in findings):
        codes.add(EXIT_VARIANT_FAILED)
    return _finish(codes)


def _cmd_check(args: argparse.Namespace) -> int:
    """`check` (design §2.12): the node's devices against the answers the server expects,
    one line per device on stdout (or --json), within --max-seconds."""
    import subprocess

    from numparity_agent import _check, _suite

    if not args.max_seconds > 0:
        raise _Usage("--max-seconds must be more than 0")
    deadline = _check.Deadline(args.max_seconds, started=_check.budget_start(args.started))
    context = _Context(args)
    if not context.server:
        raise _Usage("check needs --server (or NUMPARITY_SERVER, or server in the config "
                     "file): the server holds the answers it compares with")
    get = context.settings.get
    suite = get("suite", _workloads.SUITE)
    fail_open = get("check_fail", "closed") == "open"
    bad = [v for v in args.check_variants or () if v not in _variants.VARIANTS]
    if bad:
        raise _Usage(f"unknown variant(s) {', '.join(bad)}; valid: "
                     f"{', '.join(_variants.names())}")
    if args.drill_device and not args.fault_drill:
        raise _Usage("--drill-device names the device of --fault-drill: add it")
    try:
        parse_drill(args.fault_drill)
    except DrillSpecError as exc:
        raise _Usage(str(exc)) from None
    report = _check.CheckReport(devices=[], fail_open=fail_open)

    def out_of_time(seconds: float) -> int:
        """The watchdog's verdict (it then exits): nothing else is printed after it."""
        late = _check.CheckReport(devices=[], fail_open=fail_open, seconds=seconds,
                                  cause_code=_check.EXIT_OUT_OF_TIME,
                                  detail="stopped at the budget's end (children killed)")
        try:
            if args.json:
                sys.stdout.write(json.dumps(late.to_json(), indent=1) + "\n")
            sys.stdout.flush()
            log(late.summary())
        except OSError:
            pass
        return late.exit_code

    with _check.Watchdog(deadline, args.max_seconds, out_of_time):
        try:
            try:
                _suite.check_suite(suite)
                devices, environment, child_s = _check.list_node(get("device", _devices.ALL),
                                                                 deadline)
                drill_at = _suite.drill_slot(devices, args.drill_device) if args.fault_drill \
                    else None
            except _suite.UsageError as exc:
                raise _Usage(str(exc)) from None
            with httpx.Client(verify=context.verify) as client:
                report = _check.run_check(
                    client=client, server=context.server, token=context.token, devices=devices,
                    environment=environment, deadline=deadline, child_s=child_s, suite=suite,
                    workloads=args.check_workloads or [], variants=args.check_variants or [],
                    fail_open=fail_open, drill_at=drill_at, drill=args.fault_drill,
                    upload_timeout=context.upload_timeout, allowed=get("workloads") or (),
                    compile_cache=_compile_cache(context.settings))
        except subprocess.TimeoutExpired:
            report.cause_code, report.detail = _check.EXIT_OUT_OF_TIME, \
                "listing the devices or reading the environment took the whole budget"
        except (_suite.DeviceListError, RuntimeError) as exc:
            report.cause_code = _check.EXIT_FAILED
            report.detail = "cannot list the devices or read the environment: " + \
                str(exc).strip().splitlines()[0]
    report.seconds = deadline.elapsed()
    if args.json:
        _answer(json.dumps(report.to_json(), indent=1) + "\n")
    else:
        _answer("".join(device.line() + "\n" for device in report.devices))
    log(report.summary())
    if report.proof and report.proof.get("statement"):
        log(f"check: measured: {report.proof['statement']}")
    return report.exit_code


def _compile_cache(settings: Any) -> Path | None:
    """Inductor's cache folder for compiled answers: the node's `compile_cache` setting
    (`--compile-cache`, NUMPARITY_COMPILE_CACHE, the config), else the state folder's.
    `run`, `check` and `explain` all compile into it, so a node pays a cold compile
    once per torch version whichever command compiles first."""
    chosen = settings.get("compile_cache")
    return Path(chosen) if chosen else _compile.default_cache_dir()


def _default_explain_device() -> str:
    """cuda:0 where a GPU driver is, else the CPU: the one device explain computes on."""
    return "cuda:0" if _devices.gpu_driver_present() and sys.platform.startswith("linux") \
        else _devices.CPU


def _write_output(path: str, document: dict[str, Any]) -> None:
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(document, f, indent=1)
            f.write("\n")
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _progress_display() -> Progress | None:
    """A callback that draws `[3/12] cnn/strict 0:42` on a terminal; None elsewhere."""
    if not interactive():
        return None
    started = time.monotonic()

    def show(finished: int, total: int, what: str) -> None:
        elapsed = int(time.monotonic() - started)
        progress(f"[{finished}/{total}] {what} {elapsed // 60}:{elapsed % 60:02d}")

    return show


def _cmd_run(args: argparse.Namespace) -> int:
    from numparity_agent._suite import (
        DEFAULT_REPEATS,
        DEFAULT_TIMEOUT_S,
        UsageError,
        check_suite,
        default_variants,
        validate,
    )

    context = _Context(args)
    get = context.settings.get
    suite = get("suite", _workloads.SUITE)
    repeats = get("repeats", DEFAULT_REPEATS)
    timeout = get("timeout", DEFAULT_TIMEOUT_S)
    selection = get("device", _devices.ALL)
    try:
        try:
            check_suite(suite)
        except UsageError as exc:
            raise UsageError(f"{context.settings.sources.get('suite', '--suite')}: {exc}"
                             ) from None
        variants = get("variants") or default_variants(suite)
        workloads = get("workloads") or _workloads.builtin_names(suite)
        validate(workloads, variants, repeats, drill=args.fault_drill, suite=suite)
        if args.drill_device and not args.fault_drill:
            raise UsageError("--drill-device names the device of --fault-drill: add it")
    except UsageError as exc:
        raise _Usage(str(exc)) from None
    # The run's fork server (`_forkserver`) imports torch while the devices are listed,
    # by a child it forks as soon as it can.
    with ExitStack() as servers:
        server = None if args.fresh_interpreters else servers.enter_context(ForkServer())
        return _run_on_devices(args, context, suite=suite, workloads=workloads,
                               variants=variants, repeats=repeats, timeout=timeout,
                               selection=selection, server=server)


def _run_on_devices(args: argparse.Namespace, context: _Context, *, suite: str,
                    workloads: list[str], variants: list[str], repeats: int,
                    timeout: float, selection: str, server: ForkServer | None) -> int:
    from numparity_agent._suite import (
        DeviceListError,
        UsageError,
        drill_slot,
        select_devices,
    )

    get = context.settings.get
    try:
        try:
            devices = select_devices(selection, timeout=timeout, fork_server=server)
        except UsageError as exc:
            where = context.settings.sources.get("device", "--device")
            raise UsageError(f"{where} {selection}: {exc}") from None
        if args.fault_drill:
            drill_slot(devices, args.drill_device)
    except UsageError as exc:
        raise _Usage(str(exc)) from None
    except DeviceListError as exc:
        log(f"error: cannot list this node's devices: {exc}")
        return _finish({EXIT_VARIANT_FAILED})
    # Mistakes of configuration in seconds, before minutes of compute (`_preflight`):
    # the workloads first, the server after the jitter (a fleet's requests spread).
    problems = _preflight.workload_problems(workloads)
    if problems:
        raise _Usage("; ".join(problems))
    jitter = get("jitter", 0.0)
    if jitter > 0:
        delay = random.uniform(0, jitter)
        log(f"jitter: waiting {delay:.1f} s (a random 0..{jitter:g} s) before the run")
        sleep(delay)
    if context.server:
        problem = _preflight.server_problem(context.server, context.token,
                                            verify=context.verify,
                                            timeout=context.upload_timeout)
        if problem and problem.token_refused:
            # As `flush` and `check` say of a refused token: 5, not 2.
            log(f"error: {problem.detail}; nothing was run")
            return _finish({EXIT_REFUSED})
        if problem:
            raise _Usage(f"{problem.detail}; nothing was run")
    with ExitStack() as stack:
        if context.server:
            stopped = context.lock(stack, "run")
            if stopped is not None:
                return stopped
        return _run_locked(args, context, suite=suite, workloads=workloads,
                           variants=variants, devices=devices, repeats=repeats,
                           timeout=timeout, server=server)


def _run_locked(args: argparse.Namespace, context: _Context, *, suite: str,
                workloads: list[str], variants: list[str], devices: list[dict[str, Any]],
                repeats: int, timeout: float, server: ForkServer | None) -> int:
    from numparity_agent._suite import run_suite

    codes: set[int] = set()
    get = context.settings.get
    if context.server:
        # What earlier runs left: its 3 is settled by the flush after this run.
        codes |= _flush_codes(context.flush(), retryable=False)
    # Large tensors' values wait in the spool until the server asks for them (`_values`).
    store = _values.ValuesStore(_values.values_dir(context.spool)) if context.server else None
    try:
        document = run_suite(
            suite=suite, workloads=workloads, variants=variants, device=devices,
            repeats=repeats, node=get("node") or socket.gethostname(),
            labels=get("labels") or {}, timeout=timeout, drill=args.fault_drill,
            drill_device=args.drill_device,
            on_progress=_progress_display(),
            values_dir=store.folder if store is not None else None,
            trace_ops=bool(get("trace_ops", False)),
            study_budget_s=get("study_budget"),
            fork_server=server or False,
            compile_cache=_compile_cache(context.settings),
        )
    finally:
        end_progress()
    if store is not None:
        store.prune()
    failed = [r for r in document["results"] if r["status"] == "failed"]
    if failed:
        log(f"{len(failed)} result(s) failed")
        codes.add(EXIT_VARIANT_FAILED)
    if args.output:
        try:
            _write_output(args.output, document)
            log(f"wrote {args.output}")
        except OSError as exc:
            log(f"error: cannot write {args.output}: {exc.strerror or exc}")
            codes.add(EXIT_SPOOL_UNWRITABLE)
    if context.server:
        codes |= _spool_and_upload(context, document)
    elif not args.output:
        json.dump(document, sys.stdout, indent=1)
        sys.stdout.write("\n")
    return _finish(codes)


def _spool_and_upload(context: _Context, document: dict[str, Any]) -> set[int]:
    assert context.server
    try:
        path = _spool.spool_document(document, context.spool)
    except OSError as exc:
        # No copy on disk: send it now, with the same patience, rather than lose it.
        log(f"error: {exc.strerror or exc}; uploading run {document['run_id']} directly")
        outcome = _flush.upload_unspooled(
            document, server=context.server, token=context.token,
            timeout=context.upload_timeout, max_wait=context.max_wait,
            sleep=lambda s: sleep(s), verify=context.verify)
        codes = {EXIT_SPOOL_UNWRITABLE}
        if outcome.misconfigured:
            codes.add(EXIT_USAGE)
        elif outcome.refused or (not outcome.ok and not outcome.retry):
            codes.add(EXIT_REFUSED)
        return codes
    log(f"spooled {path.name} in {context.spool}")
    result = context.flush()
    log(f"spool {context.spool}: {result.summary()}")
    return _flush_codes(result)


def _cmd_suites(_args: argparse.Namespace) -> int:
    from numparity_agent._workloads._sizes import suites_listing

    _answer(suites_listing())
    return EXIT_OK


def _cmd_env(_args: argparse.Namespace) -> int:
    from numparity_agent._environment import capture_environment

    _answer(json.dumps(capture_environment(), indent=1) + "\n")
    return EXIT_OK


def _cmd_doctor(args: argparse.Namespace) -> int:
    from numparity_agent._doctor import as_json, diagnose, render
    from numparity_agent._environment import capture_environment

    if args.recipe is not None:
        from numparity_agent._doctor import selective_recipes

        try:
            document = json.loads(Path(args.recipe).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise _Usage(f"--recipe: cannot read a run document from {args.recipe}: "
                         f"{exc}") from None
        if not isinstance(document, dict):
            raise _Usage(f"--recipe: {args.recipe} is not a run document")
        _answer(selective_recipes(document))
        return EXIT_OK
    if args.pipeline is not None and not _workloads.is_factory_spec(args.pipeline):
        raise _Usage(f"--pipeline names a factory as module:factory, not {args.pipeline!r}")
    environment = capture_environment()
    checks = diagnose(environment=environment, pipeline=args.pipeline)
    _answer((json.dumps(as_json(checks), indent=1) if args.json
             else render(checks, environment)) + "\n")
    if args.strict and any(c.status == "warn" for c in checks):
        return EXIT_DOCTOR_WARNINGS
    return EXIT_OK


def _cmd_repro(args: argparse.Namespace) -> int:
    """Write the reproducing script of a compiled result (`_repro`)."""
    from numparity_agent import _repro

    try:
        path = _repro.write(Path(args.run_document), workload=args.workload,
                            variant=args.variant, device=args.device,
                            output=Path(args.output) if args.output else None)
    except _repro.ReproError as exc:
        raise _Usage(str(exc)) from None
    log(f"wrote {path}: python {path} reproduces it (exit 1 where compiled and eager "
        "differ)")
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()  # `check`'s budget counts from here
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on usage errors, 0 on --help
        return int(exc.code or 0)
    args.started = started
    handlers = {"run": _cmd_run, "flush": _cmd_flush, "spool": _cmd_spool, "env": _cmd_env,
                "doctor": _cmd_doctor,
                "explain": _cmd_explain, "suites": _cmd_suites, "check": _cmd_check,
                "repro": _cmd_repro}
    try:
        return handlers[args.command](args)
    except _Usage as exc:
        log(f"usage: {exc}")
        return EXIT_USAGE
    except _StdoutClosed:
        return EXIT_BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
