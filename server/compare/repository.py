"""Queries behind GET /compare: two runs, their results and the manifests of those results.

A fixed number of statements whatever the size of the runs (the fingerprints are loaded
in one batch by ``reads.fingerprints.load_fingerprints``).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from numparity_server.kit.db import chunked, lookup
from numparity_server.models import Environment, Manifest, Node, Outcome, Result, Run

ResultKey = tuple[str, str, str, str]  # suite, workload, variant, device


@dataclass(frozen=True)
class RunRow:
    pk: int
    run_id: str
    node: str
    env_key: str
    environment: dict[str, Any]
    agent_version: str | None
    started_at: datetime
    drill: bool


@dataclass(frozen=True)
class ResultRow:
    run_pk: int
    suite: str
    workload: str
    variant: str
    device: str
    workload_version: int | None
    status: str
    reason: str | None
    error: str | None
    input_hash: str | None
    param_hash: str | None
    manifest_hash: str | None
    repeats_agree: bool | None
    trace_hash: str | None
    # The agent's study of a result whose repeats disagree (design §2.13).
    nondeterminism: dict[str, Any] | None = None
    # The physical device (``devices.id``) it ran on, where ingest knew it: two results of
    # one device are judged in its arithmetic, of two devices on the CPU's.
    device_id: int | None = None
    # A compiled result's compile passes and localisation (design §2.14).
    compiled: dict[str, Any] | None = None

    @property
    def key(self) -> ResultKey:
        return self.suite, self.workload, self.variant, self.device


def runs_by_id(session: Session, run_ids: Collection[str]) -> dict[str, RunRow]:
    """The runs of these run ids that exist, by run id, with node and environment."""
    rows = session.execute(
        select(Run.id, Run.run_id, Node.name, Environment.env_key, Environment.document,
               Run.agent_version, Run.started_at, Run.drill)
        .join(Node, Node.id == Run.node_id)
        .join(Environment, Environment.id == Run.environment_id)
        .where(Run.run_id.in_(sorted(set(run_ids))))
    ).all()
    return {row.run_id: RunRow(*row) for row in rows}


def results_of_runs(
    session: Session, run_pks: Collection[int], *, workload: str | None = None,
    variant: str | None = None,
) -> list[ResultRow]:
    """The results of these runs (optionally of one workload and/or variant), each run's
    in the order of its document."""
    query = (
        select(Result.run_pk, Outcome.suite, Outcome.workload, Outcome.variant,
               Outcome.device, Outcome.workload_version, Outcome.status, Outcome.reason,
               Outcome.error, Outcome.input_hash, Outcome.param_hash, Outcome.manifest_hash,
               Outcome.repeats_agree, Outcome.trace_hash, Result.nondeterminism,
               Result.device_id, Result.compiled)
        .join(Outcome, Outcome.id == Result.outcome_id)
        .where(Result.run_pk.in_(sorted(set(run_pks))))
        .order_by(Result.id)
    )
    if workload is not None:
        query = query.where(Outcome.workload == workload)
    if variant is not None:
        query = query.where(Outcome.variant == variant)
    return [ResultRow(**row._asdict()) for row in session.execute(query)]


def stored_manifests(session: Session, hashes: Iterable[str]) -> set[str]:
    """Which of these manifests are stored (their entries not read)."""
    found: set[str] = set()
    for part in chunked(sorted(set(hashes))):
        found.update(session.scalars(select(Manifest.hash).where(Manifest.hash.in_(part))))
    return found


def manifest_entries(session: Session, hashes: Iterable[str]
                     ) -> dict[str, list[tuple[str, str, str]]]:
    """Manifest hash -> its (name, kind, hash) triples in execution order."""
    return {digest: [(e["name"], e["kind"], e["hash"]) for e in entries]
            for digest, entries in lookup(session, Manifest.hash, Manifest.entries,
                                          hashes).items()}
