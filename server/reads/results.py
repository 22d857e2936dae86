"""The results of a list of runs, and manifests by hash: what the node timeline, the
audit's drift and the run comparison read of stored runs."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from numparity_server.kit.db import chunked, lookup
from numparity_server.models import Manifest, Outcome, Result


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
