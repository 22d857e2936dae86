"""Empty the spool: every document is uploaded, oldest first, or settled for a reason.

This module is the retry and settle policy; one exchange with the server is `_upload`,
the files it settles are `_spool`'s.

What becomes of a spooled file:

- 2xx: deleted (the server has it; sending the same run again answers 200, not a copy).
- No answer, 5xx, 408, 429: retried with exponential backoff (1, 2, 4 ... 30 s, each
  between half and all of that, never sooner than the server's Retry-After) for at most
  `max_wait` seconds and `MAX_FAILURES` failures without progress (attempts included),
  then the flush stops and the rest stays spooled: the next run tries again, and a server
  that is down is not hammered with every file. Uploads in parts resume where the last
  attempt left them, and an attempt after which the server holds more of one than before
  starts the count again: a large upload that the server's byte budget throttles with
  429 goes on while each attempt moves it forward. A TLS failure stops at once (waiting
  fixes no certificate).
- 401/403: the token is bad or revoked. The document stays in the spool, the flush
  stops (every other document would be refused the same way) and says so loudly, with
  the server's reason.
- 403 for the document's own content (a token bound to other nodes than the run's
  node, `node_forbidden`): the document is set aside in `rejected/` with the reason, as
  any other refusal of a document, and the others go on: one run made under a wrong
  `--node` never blocks the runs after it. `numparity-agent spool` lists it and sends
  it again on request (`_spool_admin`).
- An answer numparity's API cannot have given (a 404 or 405, a 2xx that is no run's,
  a 4xx that is not its JSON error: `--server` names another path or another web
  server): a configuration error. The document stays in the spool, the flush stops and
  says which URL to use.
- 413: a body too large is split into parts and sent again (`_upload`); a 413 left over
  (a server too old to take parts, a document past its NUMPARITY_MAX_DOCUMENT_BYTES) is
  not the document's fault: it stays in the spool, said loudly, and the others go on.
- Any other 4xx (400, 409, 422 ...): the server refuses this document for good: it
  moves to `rejected/` with a `.reason` file, and the others go on.
- Not a run document (truncated, not JSON, not ours): moved to `quarantine/` with a
  `.reason` file before anything is sent; the others go on. So are temporary files of a
  write that crashed.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from numparity_agent import _spool
from numparity_agent._answer import ServerAnswer, Verify, server_message
from numparity_agent._log import log
from numparity_agent._parts import Held
from numparity_agent._upload import DEFAULT_TIMEOUT_S, upload_document
from numparity_agent._values import ValuesStore, values_dir

DEFAULT_MAX_WAIT_S = 60.0
BACKOFF_BASE_S = 1.0
BACKOFF_CAP_S = 30.0
MAX_FAILURES = 20  # in a row without progress, however long max_wait is


@dataclass
class Backoff:
    """When to try again after a failure, and when to give up (the module's rule)."""

    max_wait: float = DEFAULT_MAX_WAIT_S
    sleep: Callable[[float], None] = time.sleep
    rng: random.Random = field(default_factory=random.Random)
    spent: float = 0.0  # seconds waited or spent failing since the last progress
    streak: int = 0  # failures since the last success
    failures: int = 0  # since the last progress
    # How far the server got with each upload in parts: attempts resume there, and an
    # attempt after which it holds more than before made progress.
    held: Held = field(default_factory=dict)

    def next_delay(self, outcome: ServerAnswer, attempt_s: float) -> float | None:
        """Seconds to wait before the next attempt, or None to give up."""
        if self.failures:
            self.spent += attempt_s
        self.failures += 1
        self.streak += 1
        if self.failures >= MAX_FAILURES:
            return None
        step = min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** (self.streak - 1))
        delay = step / 2 + self.rng.uniform(0, step / 2)
        if outcome.retry_after is not None:
            delay = max(delay, outcome.retry_after)
        if self.spent + delay > self.max_wait:
            return None
        return delay

    def wait(self, delay: float) -> None:
        self.spent += delay
        self.sleep(delay)

    def succeeded(self) -> None:
        self.streak = 0

    def progressed(self, before: Held) -> None:
        """After a failed attempt: when the server holds more of an upload than ``before``
        it, the count starts again (a bounded number of times: ``held`` only grows, up to
        each upload's size)."""
        if any(size > before.get(upload, 0) for upload, size in self.held.items()):
            self.spent, self.streak, self.failures = 0.0, 0, 0


@dataclass
class FlushResult:
    """What a flush did, file by file (paths as they were in the spool)."""

    outcomes: list[ServerAnswer] = field(default_factory=list)
    uploaded: list[Path] = field(default_factory=list)
    kept: list[Path] = field(default_factory=list)  # worth retrying: the next run does
    refused: list[Path] = field(default_factory=list)  # 401/403: kept, the token is wrong
    # Kept: the server's URL answers, but not as numparity's API (a configuration error).
    misconfigured: list[Path] = field(default_factory=list)
    rejected: list[Path] = field(default_factory=list)  # moved to rejected/
    quarantined: list[Path] = field(default_factory=list)  # moved to quarantine/
    spool_errors: list[str] = field(default_factory=list)  # the spool could not be changed

    def summary(self) -> str:
        parts = [f"{len(self.uploaded)} uploaded"]
        for name, paths in (("kept", self.kept), ("refused (token)", self.refused),
                            ("kept (the server's URL is wrong)", self.misconfigured),
                            ("rejected", self.rejected), ("quarantined", self.quarantined)):
            if paths:
                parts.append(f"{len(paths)} {name}")
        return ", ".join(parts)


def _describe(outcome: ServerAnswer) -> str:
    if outcome.status is None:
        return outcome.detail
    return f"HTTP {outcome.status}, {server_message(outcome.detail)}"


def attempt_with_backoff(
    send: Callable[[Held], ServerAnswer], *, name: str, backoff: Backoff,
    log_line: Callable[[str], None],
) -> ServerAnswer:
    """`send(held)` until it answers something not worth retrying or the backoff gives
    up; `held` (the backoff's) is where its uploads in parts resume."""
    while True:
        started = time.monotonic()
        before = dict(backoff.held)
        outcome = send(backoff.held)
        if outcome.ok:
            backoff.succeeded()
        if not outcome.retry or outcome.cause == "tls":
            return outcome
        backoff.progressed(before)
        delay = backoff.next_delay(outcome, time.monotonic() - started)
        if delay is None:
            log_line(f"{name}: giving up after {backoff.streak} attempt(s) and "
                     f"{backoff.spent:.0f} s (--max-wait {backoff.max_wait:g})")
            return outcome
        log_line(f"{name}: {_describe(outcome)}; retrying in {delay:.1f} s")
        backoff.wait(delay)


def quarantine(path: Path, reason: str, result: FlushResult,
               log_line: Callable[[str], None]) -> None:
    try:
        target = _spool.move_aside(path, _spool.QUARANTINE, reason)
    except OSError as exc:
        result.spool_errors.append(f"cannot move {path} to quarantine: {exc}")
        log_line(f"error: cannot move {path} to {_spool.QUARANTINE}/: {exc.strerror or exc}")
        return
    result.quarantined.append(path)
    log_line(f"warning: {path.name} is {reason}: moved to {target}")


def _settle(path: Path, outcome: ServerAnswer, result: FlushResult, server: str,
            log_line: Callable[[str], None]) -> None:
    result.outcomes.append(outcome)
    if outcome.ok:
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:  # uploaded, but it will be sent again (and answered 200)
            result.spool_errors.append(f"cannot delete {path}: {exc}")
            log_line(f"error: uploaded {path.name} but cannot delete it from the spool: "
                     f"{exc.strerror or exc}")
        result.uploaded.append(path)
        log_line(f"uploaded {path.name} (HTTP {outcome.status})")
    elif outcome.misconfigured:
        result.misconfigured.append(path)
        log_line(f"error: {path.name} stays in the spool: {outcome.detail}. The server's "
                 f"address is wrong: {_address_hint(server)} (--server, NUMPARITY_SERVER or "
                 "server in the config file), then run `numparity-agent flush`")
    elif outcome.refused:
        result.refused.append(path)
        log_line(f"error: {server} refused the agent token for {path.name} "
                 f"({_describe(outcome)}); it stays in the spool: check the token "
                 "(--token-file, NUMPARITY_TOKEN_FILE or token_file; a token bound to "
                 "nodes must name this run's node), then run `numparity-agent flush`")
    elif outcome.retry:
        result.kept.append(path)
        log_line(f"kept {path.name} in the spool: {_describe(outcome)}")
    elif outcome.status == 413:
        result.kept.append(path)
        log_line(f"error: {server} takes no body as large as {path.name} even in parts "
                 f"({_describe(outcome)}); it stays in the spool: upgrade the server or "
                 "raise the setting it names, then run `numparity-agent flush`")
    else:
        reason = (f"rejected by {server} (HTTP {outcome.status}): "
                  f"{server_message(outcome.detail, limit=4000)}")
        try:
            target = _spool.move_aside(path, _spool.REJECTED, reason)
        except OSError as exc:
            result.spool_errors.append(f"cannot move {path} to rejected: {exc}")
            result.kept.append(path)
            log_line(f"error: server rejected {path.name} ({_describe(outcome)}) and it "
                     f"cannot be moved to {_spool.REJECTED}/: {exc.strerror or exc}")
            return
        result.rejected.append(path)
        log_line(f"error: server rejected {path.name} ({_describe(outcome)}); moved to "
                 f"{target} with the reason beside it (`numparity-agent spool` lists it; "
                 "`spool resend` sends it again, `spool drop` deletes it)")


def _address_hint(server: str) -> str:
    """What --server should be: the address the server's pages are at, no API path."""
    base = server.rstrip("/")
    for suffix in ("/api/v1", "/api"):
        if base.endswith(suffix):
            return (f"it is the address the dashboard is at, without {suffix}: "
                    f"{base[: -len(suffix)]}")
    return f"{base} must be a numparity server's address (the dashboard's, without /api/v1)"


def _clean_temporary_files(spool_dir: Path, result: FlushResult,
                           log_line: Callable[[str], None]) -> None:
    for tmp in _spool.stale_temporary_files(spool_dir):
        if _spool.is_cache_temporary(tmp):
            tmp.unlink(missing_ok=True)
            continue
        quarantine(tmp, "the temporary file of a write that did not finish", result, log_line)


def flush_spool(
    spool_dir: Path,
    *,
    server: str,
    token: str | None,
    timeout: float = DEFAULT_TIMEOUT_S,
    log_line: Callable[[str], None] = log,
    max_wait: float = DEFAULT_MAX_WAIT_S,
    sleep: Callable[[float], None] = time.sleep,
    verify: Verify = True,
    backoff: Backoff | None = None,
) -> FlushResult:
    """Upload what is spooled, oldest first, and settle each file (the module's rules)."""
    result = FlushResult()
    _clean_temporary_files(spool_dir, result, log_line)
    paths = _spool.spooled(spool_dir)
    if not paths:
        return result
    backoff = backoff or Backoff(max_wait=max_wait, sleep=sleep)
    known = _spool.KnownManifests(_spool.known_manifests_file(spool_dir), server)
    store = ValuesStore(values_dir(spool_dir))
    with httpx.Client(timeout=timeout, verify=verify) as client:
        for index, path in enumerate(paths):
            try:
                document = _spool.read_spooled(path)
            except _spool.CorruptSpoolFile as exc:
                quarantine(path, str(exc), result, log_line)
                continue

            def send(held: Held, document: dict[str, Any] = document) -> ServerAnswer:
                return upload_document(document, server=server, token=token, client=client,
                                       known=known, values=store, held=held)

            outcome = attempt_with_backoff(send, name=path.name, backoff=backoff,
                                           log_line=log_line)
            _settle(path, outcome, result, server, log_line)
            if outcome.retry or outcome.refused or outcome.misconfigured:
                rest = [p for p in paths[index + 1:] if p.exists()]
                result.kept.extend(rest)
                if outcome.retry and rest:
                    log_line(f"stopped: {len(rest)} more document(s) stay in the spool "
                             "for the next run")
                break
    return result


def send_spooled(
    path: Path, *, server: str, token: str | None, timeout: float = DEFAULT_TIMEOUT_S,
    log_line: Callable[[str], None] = log, verify: Verify = True,
) -> ServerAnswer:
    """Upload one spooled document, once, and settle it by the module's rules, without
    backing off: for a caller that schedules its own attempts (bench/_faults.py)."""
    result = FlushResult()
    try:
        document = _spool.read_spooled(path)
    except _spool.CorruptSpoolFile as exc:
        quarantine(path, str(exc), result, log_line)
        return ServerAnswer(None, f"quarantined: {exc}", cause="quarantined")
    known = _spool.KnownManifests(_spool.known_manifests_file(path.parent), server)
    outcome = upload_document(document, server=server, token=token, timeout=timeout,
                              known=known, verify=verify)
    _settle(path, outcome, result, server, log_line)
    return outcome


def upload_unspooled(
    document: dict[str, Any], *, server: str, token: str | None,
    timeout: float = DEFAULT_TIMEOUT_S, log_line: Callable[[str], None] = log,
    max_wait: float = DEFAULT_MAX_WAIT_S, sleep: Callable[[float], None] = time.sleep,
    verify: Verify = True,
) -> ServerAnswer:
    """Upload a document the spool could not take, with the same backoff: the only copy."""
    backoff = Backoff(max_wait=max_wait, sleep=sleep)
    with httpx.Client(timeout=timeout, verify=verify) as client:
        outcome = attempt_with_backoff(
            lambda held: upload_document(document, server=server, token=token,
                                         client=client, held=held),
            name=f"run {document.get('run_id')}", backoff=backoff, log_line=log_line)
    if outcome.ok:
        log_line(f"uploaded run {document.get('run_id')} directly (HTTP {outcome.status})")
    else:
        log_line(f"error: run {document.get('run_id')} is lost: the spool could not take it "
                 f"and the server did not ({_describe(outcome)})")
    return outcome
