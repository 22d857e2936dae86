"""The results of a list of runs, manifests by hash and the runs of results: what the
node timeline, the audit (its drift, its rows' runs), /divergence's members and the run
comparison read of stored runs."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from numparity_server.kit.db import chunked, lookup
from numparity_server.models import Manifest, Outcome, Result, Run


def results_of_runs(session: Session, run_pks: Sequence[int]) -> Sequence[Any]:
    """Rows (run_pk, suite, workload, variant, device, status, manifest_hash, device_id)
    of every result of these runs (``runs.id`` keys)."""
    rows: list[Any] = []
    for part in chunked(run_pks):
        rows.extend(session.execute(
            select(Result.run_pk, Outcome.suite, Outcome.workload, Outcome.variant,
                   Outcome.device, Outcome.status, Outcome.manifest_hash, Result.device_id)
            .join(Outcome, Outcome.id == Result.outcome_id)
            .where(Result.run_pk.in_(part))
        ).all())
    return rows


def manifest_entries(session: Session, hashes: Iterable[str]
                     ) -> dict[str, list[dict[str, Any]]]:
    """Manifest hash -> its entries ({name, kind, hash}) in execution order."""
    return lookup(session, Manifest.hash, Manifest.entries, hashes)


def run_ids_of_results(session: Session, result_ids: Iterable[int]) -> dict[int, str]:
    """result id → the run_id of its run.

    Looked up by result id, apart from the query that found the results: joined to it,
    PostgreSQL, estimating 20 times the latest rows that a few outcomes or nodes hold,
    scanned the whole of results (6 million rows at 100,000 nodes: 1 s a query)."""
    runs: dict[int, str] = {}
    for part in chunked(sorted(set(result_ids))):
        runs.update((result_id, run_id) for result_id, run_id in session.execute(
            select(Result.id, Run.run_id).join(Run, Run.id == Result.run_pk)
            .where(Result.id.in_(part))))
    return runs
