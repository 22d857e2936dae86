"""Queries of retention: expired runs, and content no remaining result references."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, delete, exists, func, or_, select
from sqlalchemy.orm import Session

from numparity_server.models import (
    Environment,
    Explanation,
    Fingerprint,
    GoldenAnswer,
    KeptComparison,
    Latest,
    LatestCount,
    Manifest,
    Node,
    Outcome,
    Result,
    Run,
    Trace,
)


def _holds_latest() -> ColumnElement[bool]:
    """The run holds some node's latest result of a key: it is never dropped (latest
    has no foreign key to results, so this is what keeps its rows pointing somewhere).
    One pass over latest, hashed by the database (latest.result_id has no index)."""
    return Run.id.in_(
        select(Result.run_pk).join(Latest, Latest.result_id == Result.id).scalar_subquery()
    )


def _expired(cutoff: datetime) -> ColumnElement[bool]:
    return (Run.received_at < cutoff) & ~_holds_latest()


def expired_run_ids(session: Session, cutoff: datetime, *, limit: int) -> list[int]:
    return list(session.scalars(
        select(Run.id).where(_expired(cutoff)).order_by(Run.id).limit(limit)
    ))


def count_expired(session: Session, cutoff: datetime) -> tuple[int, int]:
    """(runs, results) that retention would drop."""
    runs = session.scalar(select(func.count()).select_from(Run).where(_expired(cutoff))) or 0
    results = session.scalar(
        select(func.count()).select_from(Result).join(Run, Run.id == Result.run_pk)
        .where(_expired(cutoff))
    ) or 0
    return runs, results


def delete_runs(session: Session, run_ids: Sequence[int]) -> tuple[int, int]:
    """Drop these runs and their results; (runs, results) this transaction dropped: those
    another retention dropped first (the same batch, chosen before it committed) are not
    counted twice."""
    results = session.execute(delete(Result).where(Result.run_pk.in_(run_ids)))
    runs = session.execute(delete(Run).where(Run.id.in_(run_ids)))
    return (int(getattr(runs, "rowcount", 0) or 0), int(getattr(results, "rowcount", 0) or 0))


def _unreferenced_outcome() -> ColumnElement[bool]:
    return ~exists(select(Result.id).where(Result.outcome_id == Outcome.id))


def orphan_outcomes(session: Session, *, limit: int) -> list[int]:
    return list(session.scalars(
        select(Outcome.id).where(_unreferenced_outcome()).order_by(Outcome.id).limit(limit)
    ))


def delete_outcomes(session: Session, ids: Sequence[int]) -> int:
    # Checked again in the statement: a result stored since the batch was chosen keeps it.
    deleted = session.execute(delete(Outcome).where(Outcome.id.in_(ids), _unreferenced_outcome()))
    # Their counts went to 0 with their last latest row: they go with the outcome (an id
    # SQLite gives again must not find an old count).
    session.execute(delete(LatestCount).where(
        LatestCount.outcome_id.in_(ids),
        ~exists(select(Outcome.id).where(Outcome.id == LatestCount.outcome_id))))
    return int(getattr(deleted, "rowcount", 0) or 0)


def _unreferenced_environment(before: datetime) -> ColumnElement[bool]:
    """No run, latest result, count of devices, node or finding refers to it (the empty
    counts it keeps go with it), and it is older than ``before`` (an upload that has
    just found it keeps it)."""
    return (Environment.first_seen < before) & ~or_(*(
        exists(select(column).where(column == Environment.id))
        for column in (Run.environment_id, Latest.environment_id, Node.environment_id,
                       Explanation.environment_id)
    ), exists(select(LatestCount.id).where(LatestCount.environment_id == Environment.id,
                                           LatestCount.devices > 0)))


def orphan_environments(session: Session, before: datetime, *, limit: int) -> list[int]:
    return list(session.scalars(
        select(Environment.id).where(_unreferenced_environment(before))
        .order_by(Environment.id).limit(limit)))


def count_orphan_environments(session: Session, before: datetime) -> int:
    return session.scalar(select(func.count()).select_from(Environment)
                          .where(_unreferenced_environment(before))) or 0


def delete_environments(session: Session, ids: Sequence[int], before: datetime) -> int:
    """Checked again in the statement: a run stored since the batch was chosen keeps its
    environment."""
    chosen = select(Environment.id).where(Environment.id.in_(ids),
                                          _unreferenced_environment(before))
    session.execute(delete(LatestCount).where(LatestCount.environment_id.in_(chosen),
                                              LatestCount.devices == 0))
    deleted = session.execute(delete(Environment).where(Environment.id.in_(ids),
                                                        _unreferenced_environment(before)))
    return int(getattr(deleted, "rowcount", 0) or 0)


def _unreferenced_manifest() -> ColumnElement[bool]:
    """No outcome and no pinned answer refers to it: a pinned manifest, and so its
    fingerprints, outlives the runs that reported it (design §3.11)."""
    return (~exists(select(Outcome.id).where(Outcome.manifest_hash == Manifest.hash))
            & ~exists(select(GoldenAnswer.id).where(GoldenAnswer.manifest_hash == Manifest.hash)))


def orphan_manifests(session: Session, *, limit: int) -> list[str]:
    return list(session.scalars(
        select(Manifest.hash).where(_unreferenced_manifest()).order_by(Manifest.hash).limit(limit)
    ))


def delete_manifests(session: Session, hashes: Sequence[str]) -> int:
    # Checked again in the statement: a result stored since the batch was chosen keeps it.
    deleted = session.execute(
        delete(Manifest).where(Manifest.hash.in_(hashes), _unreferenced_manifest())
    )
    return int(getattr(deleted, "rowcount", 0) or 0)


def manifests_dropped_with(session: Session, cutoff: datetime) -> set[str]:
    """Manifests whose every reference is a result of an expired run (for a dry run)."""
    surviving = (
        select(Result.id).join(Run, Run.id == Result.run_pk)
        .join(Outcome, Outcome.id == Result.outcome_id)
        .where(Outcome.manifest_hash == Manifest.hash, ~_expired(cutoff))
    )
    pinned = select(GoldenAnswer.id).where(GoldenAnswer.manifest_hash == Manifest.hash)
    return set(session.scalars(select(Manifest.hash).where(~exists(surviving),
                                                           ~exists(pinned))))


def _unreferenced_trace() -> ColumnElement[bool]:
    return ~exists(select(Outcome.id).where(Outcome.trace_hash == Trace.hash))


def orphan_traces(session: Session, *, limit: int) -> list[str]:
    return list(session.scalars(
        select(Trace.hash).where(_unreferenced_trace()).order_by(Trace.hash).limit(limit)
    ))


def delete_traces(session: Session, hashes: Sequence[str]) -> int:
    # Checked again in the statement: a result stored since the batch was chosen keeps it.
    deleted = session.execute(delete(Trace).where(Trace.hash.in_(hashes), _unreferenced_trace()))
    return int(getattr(deleted, "rowcount", 0) or 0)


def count_traces_dropped_with(session: Session, cutoff: datetime) -> int:
    """Traces whose every reference is a result of an expired run (for a dry run)."""
    surviving = (
        select(Result.id).join(Run, Run.id == Result.run_pk)
        .join(Outcome, Outcome.id == Result.outcome_id)
        .where(Outcome.trace_hash == Trace.hash, ~_expired(cutoff))
    )
    return session.scalar(select(func.count()).select_from(Trace).where(~exists(surviving))) or 0


def manifest_entries(session: Session, *, created_since: datetime | None = None,
                     page: int = 1000) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """Every manifest (or those created since a time) as (hash, entries), paged by hash."""
    after = ""
    while True:
        query = select(Manifest.hash, Manifest.entries).where(Manifest.hash > after)
        if created_since is not None:
            query = query.where(Manifest.created_at >= created_since)
        rows = session.execute(query.order_by(Manifest.hash).limit(page)).all()
        if not rows:
            return
        yield from ((digest, entries) for digest, entries in rows)
        after = rows[-1][0]


def fingerprint_hashes(session: Session, *, page: int = 5000) -> Iterator[str]:
    after = ""
    while True:
        hashes = list(session.scalars(
            select(Fingerprint.hash).where(Fingerprint.hash > after)
            .order_by(Fingerprint.hash).limit(page)
        ))
        if not hashes:
            return
        yield from hashes
        after = hashes[-1]


def delete_fingerprints(session: Session, hashes: Sequence[str]) -> int:
    deleted = session.execute(delete(Fingerprint).where(Fingerprint.hash.in_(hashes)))
    return int(getattr(deleted, "rowcount", 0) or 0)


def _not_stored(column: Any) -> ColumnElement[bool]:
    """No manifest, fingerprint or trace has this hash (a kept comparison names either)."""
    return (~exists(select(Manifest.hash).where(Manifest.hash == column))
            & ~exists(select(Fingerprint.hash).where(Fingerprint.hash == column))
            & ~exists(select(Trace.hash).where(Trace.hash == column)))


def _dead_comparison(cutoff: datetime) -> ColumnElement[bool]:
    return or_(KeptComparison.created_at < cutoff, _not_stored(KeptComparison.hash_a),
               _not_stored(KeptComparison.hash_b))


def dead_comparisons(session: Session, cutoff: datetime, *, limit: int) -> list[str]:
    return list(session.scalars(
        select(KeptComparison.key).where(_dead_comparison(cutoff))
        .order_by(KeptComparison.key).limit(limit)))


def count_dead_comparisons(session: Session, cutoff: datetime) -> int:
    return session.scalar(select(func.count()).select_from(KeptComparison)
                          .where(_dead_comparison(cutoff))) or 0


def delete_comparisons(session: Session, keys: Sequence[str]) -> int:
    deleted = session.execute(delete(KeptComparison).where(KeptComparison.key.in_(keys)))
    return int(getattr(deleted, "rowcount", 0) or 0)
