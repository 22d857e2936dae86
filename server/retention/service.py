"""Retention (design §3.7): drop runs older than N days, then content nothing references,
then the kept comparisons of content that is gone, and the parts of uploads nobody
finished within a day.

A run that holds a node's latest result of some key is kept however old it is: the
fleet's current picture (divergence, audit) is made of those. Runs go in batches, each
its own short transaction, so ingest is never blocked for long. Manifests and
fingerprints (and op traces) are content-addressed and shared between runs: only those
no remaining result (manifest) references are dropped afterwards.

Known window: an upload that refers by bare hash to a fingerprint (or reuses a manifest)
which only expired runs referenced, racing with the deletion of exactly that content, can
lose it. Nodes keep their latest results, so content a node still produces is referenced
and never dropped; the window needs a node that reproduces content only old runs had.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from numparity_server.kit.db import writing
from numparity_server.models import utcnow
from numparity_server.retention import repository
from numparity_server.uploads import repository as uploads
from numparity_server.uploads.service import STALE_AFTER

# Manifests committed while the fingerprint scan runs may carry an ingest time a little
# before the scan started; they are re-read with this margin before each delete.
_INGEST_MARGIN = timedelta(minutes=10)


@dataclass(frozen=True)
class RetentionReport:
    cutoff: datetime
    dry_run: bool
    runs: int
    results: int
    manifests: int
    fingerprints: int
    traces: int = 0
    comparisons: int = 0  # kept /divergence comparisons
    environments: int = 0  # environments no run, node or latest result refers to
    upload_parts: int = 0  # parts of uploads nobody finished within STALE_AFTER


def apply_retention(*, sessions: Callable[[], Session], days: int, batch_size: int = 500,
                    dry_run: bool = False, now: datetime | None = None) -> RetentionReport:
    """Drop (or with ``dry_run`` count) runs received more than ``days`` days ago."""
    if days < 1 or batch_size < 1:
        raise ValueError("days and batch_size must be at least 1")
    cutoff = (now or utcnow()) - timedelta(days=days)
    if dry_run:
        return _dry_run(sessions, cutoff, now or utcnow())

    runs = results = 0
    previous: list[int] = []
    while True:
        with sessions() as session, writing(session):
            batch = repository.expired_run_ids(session, cutoff, limit=batch_size)
            if not batch:
                break
            # What this transaction dropped: a concurrent retention that chose the same
            # batch first counts it, this one 0 (two counted 170 runs for 90 dropped).
            dropped_runs, dropped_results = repository.delete_runs(session, batch)
        runs += dropped_runs
        results += dropped_results
        if dropped_runs == 0 and batch == previous:
            break  # not another retention's batch under way: runs that cannot go
        previous = batch

    while True:
        with sessions() as session, writing(session):
            ids = repository.orphan_outcomes(session, limit=batch_size)
            if not ids:
                break
            if repository.delete_outcomes(session, ids) == 0:
                break  # every candidate was taken back by a new result

    manifests = 0
    while True:
        with sessions() as session, writing(session):
            hashes = repository.orphan_manifests(session, limit=batch_size)
            if not hashes:
                break
            deleted = repository.delete_manifests(session, hashes)
            manifests += deleted
        if deleted == 0:  # every candidate was taken back by a new result
            break

    traces = 0
    while True:
        with sessions() as session, writing(session):
            hashes = repository.orphan_traces(session, limit=batch_size)
            if not hashes:
                break
            deleted = repository.delete_traces(session, hashes)
            traces += deleted
        if deleted == 0:  # every candidate was taken back by a new result
            break

    fingerprints = _drop_orphan_fingerprints(sessions, batch_size)
    environments = _drop_orphan_environments(sessions, batch_size)

    # Kept comparisons (design §3.3.7) whose answers are gone, or computed before the
    # cutoff (another policy's, or of answers nobody asks about: /divergence computes
    # them again, one per answer, when asked).
    comparisons = 0
    while True:
        with sessions() as session, writing(session):
            keys = repository.dead_comparisons(session, cutoff, limit=batch_size)
            if not keys:
                break
            comparisons += repository.delete_comparisons(session, keys)
    # Parts of uploads nobody finished (an agent gone, a run abandoned): a day after
    # their last part, whatever the runs' window.
    upload_parts = 0
    stale = (now or utcnow()) - STALE_AFTER
    while True:
        with sessions() as session, writing(session, changes_answers=False):
            ids = uploads.stale_part_ids(session, before=stale, limit=batch_size)
            if not ids:
                break
            upload_parts += uploads.delete_parts(session, ids)
    return RetentionReport(cutoff=cutoff, dry_run=False, runs=runs, results=results,
                           manifests=manifests, fingerprints=fingerprints, traces=traces,
                           comparisons=comparisons, environments=environments,
                           upload_parts=upload_parts)


def _drop_orphan_environments(sessions: Callable[[], Session], batch_size: int) -> int:
    """Environments (whole documents, up to 256 KiB each) kept only while something
    refers to them: a node that sent a new env_key per upload leaves none behind."""
    before = utcnow() - _INGEST_MARGIN
    dropped = 0
    while True:
        try:
            with sessions() as session, writing(session):
                ids = repository.orphan_environments(session, before, limit=batch_size)
                if not ids:
                    break
                deleted = repository.delete_environments(session, ids, before)
        except IntegrityError:
            # PostgreSQL: an upload took one of them back between the check and the
            # delete; the next retention drops what is still unreferenced then.
            break
        dropped += deleted
        if deleted == 0:
            break
    return dropped


def _referenced(session: Session, *, skip: Collection[str] = (),
                created_since: datetime | None = None) -> set[str]:
    referenced: set[str] = set()
    for digest, entries in repository.manifest_entries(session, created_since=created_since):
        if digest not in skip:
            referenced.update(entry["hash"] for entry in entries)
    return referenced


def _drop_orphan_fingerprints(sessions: Callable[[], Session], batch_size: int) -> int:
    scan_started = utcnow()
    with sessions() as session:
        referenced = _referenced(session)
        orphans = [h for h in repository.fingerprint_hashes(session) if h not in referenced]
    dropped = 0
    for start in range(0, len(orphans), batch_size):
        with sessions() as session, writing(session):
            recent = _referenced(session, created_since=scan_started - _INGEST_MARGIN)
            batch = [h for h in orphans[start : start + batch_size] if h not in recent]
            if batch:
                dropped += repository.delete_fingerprints(session, batch)
    return dropped


def _dry_run(sessions: Callable[[], Session], cutoff: datetime, now: datetime
             ) -> RetentionReport:
    with sessions() as session:
        runs, results = repository.count_expired(session, cutoff)
        doomed = repository.manifests_dropped_with(session, cutoff)
        referenced = _referenced(session, skip=doomed)
        fingerprints = sum(1 for h in repository.fingerprint_hashes(session)
                           if h not in referenced)
        traces = repository.count_traces_dropped_with(session, cutoff)
        # Those computed before the cutoff or whose answers are gone now; more go once
        # the content above does.
        comparisons = repository.count_dead_comparisons(session, cutoff)
        # Those unreferenced now; those of the runs above go once they do.
        environments = repository.count_orphan_environments(session,
                                                            utcnow() - _INGEST_MARGIN)
        upload_parts = len(uploads.stale_part_ids(session, before=now - STALE_AFTER))
    return RetentionReport(cutoff=cutoff, dry_run=True, runs=runs, results=results,
                           manifests=len(doomed), fingerprints=fingerprints, traces=traces,
                           comparisons=comparisons, environments=environments,
                           upload_parts=upload_parts)
