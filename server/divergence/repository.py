"""Queries behind GET /divergence: latest results of a key, and the comparisons kept."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, func, select, update
from sqlalchemy.orm import Session

from numparity_server.analysis import ComparisonRecord
from numparity_server.analysis.consensus import Support
from numparity_server.kit.db import chunked, codepoint_order, insert_ignoring_conflicts, lookup
from numparity_server.models import (
    Environment,
    KeptComparison,
    Latest,
    Manifest,
    Node,
    Outcome,
    Result,
    Run,
    utcnow,
)


@dataclass(frozen=True)
class LatestResult:
    node: str
    run_id: str
    env_key: str
    environment: dict[str, Any]
    device: str
    workload_version: int | None
    input_hash: str | None
    param_hash: str | None
    entries: list[dict[str, Any]]
    trace_hash: str | None = None
    manifest_hash: str | None = None


def latest_ok_results(
    session: Session, *, suite: str, workload: str, variant: str
) -> list[LatestResult]:
    """Every node's newest result of the key, when that result is ok (it has a manifest).

    Nodes of one environment share its document (one dict per environment: a fleet of
    10,000 nodes has a few dozen environments), and results of one manifest its entries.
    """
    rows = session.execute(
        select(Node.name, Run.run_id, Environment.env_key, Run.environment_id, Outcome.device,
               Outcome.workload_version, Outcome.input_hash, Outcome.param_hash,
               Outcome.manifest_hash, Outcome.trace_hash)
        .select_from(Latest)
        .join(Outcome, Outcome.id == Latest.outcome_id)
        .join(Result, Result.id == Latest.result_id)
        .join(Run, Run.id == Result.run_pk)
        .join(Node, Node.id == Latest.node_id)
        .join(Environment, Environment.id == Latest.environment_id)
        .where(Latest.suite == suite, Latest.workload == workload, Latest.variant == variant,
               Outcome.status == "ok", Outcome.manifest_hash.is_not(None))
        .order_by(Node.name)
    ).all()
    documents = lookup(session, Environment.id, Environment.document,
                        {row.environment_id for row in rows})
    entries = lookup(session, Manifest.hash, Manifest.entries,
                      {row.manifest_hash for row in rows})
    return [
        LatestResult(row.name, row.run_id, row.env_key, documents[row.environment_id],
                     row.device, row.workload_version, row.input_hash, row.param_hash,
                     entries[row.manifest_hash], row.trace_hash, row.manifest_hash)
        for row in rows
    ]


def outcome_counts(session: Session, *, suite: str, workload: str, variant: str
                   ) -> list[tuple[Any, Support, list[dict[str, Any]]]]:
    """The key's latest ok results by outcome: (outcome, its support, manifest entries)."""
    rows = session.execute(
        select(Outcome.workload_version, Outcome.device, Outcome.manifest_hash, func.count(),
               func.min(codepoint_order(session, Node.name)))
        .select_from(Latest)
        .join(Outcome, Outcome.id == Latest.outcome_id)
        .join(Node, Node.id == Latest.node_id)
        .where(Latest.suite == suite, Latest.workload == workload, Latest.variant == variant,
               Outcome.status == "ok", Outcome.manifest_hash.is_not(None))
        .group_by(Outcome.workload_version, Outcome.device, Outcome.manifest_hash)
    ).all()
    entries = lookup(session, Manifest.hash, Manifest.entries,
                      {row.manifest_hash for row in rows})
    return [(row, Support(int(row[3]), row[4]), entries[row.manifest_hash]) for row in rows]



@dataclass(frozen=True)
class Kept:
    value: dict[str, Any]
    awaiting: list[str]  # fingerprints it read without their whole values


def kept_comparisons(session: Session, keys: Collection[str]) -> dict[str, Kept]:
    """The comparisons kept under these keys (one query per 500)."""
    found: dict[str, Kept] = {}
    for part in chunked(sorted(keys)):
        for key, value, awaiting in session.execute(
                select(KeptComparison.key, KeptComparison.value, KeptComparison.awaiting)
                .where(KeptComparison.key.in_(part))):
            found[key] = Kept(value, awaiting)
    return found


def keep_comparisons(session: Session, records: Sequence[ComparisonRecord], *,
                     refreshed: Collection[str] = ()) -> None:
    """Store new comparisons, and replace those in ``refreshed`` (computed again once the
    values they lacked arrived).

    Two requests computing the same key both insert it: ON CONFLICT DO NOTHING keeps the
    first (they computed the same content), on SQLite and PostgreSQL alike; keys go in
    sorted, so concurrent inserts lock in one order.
    """
    now = utcnow()
    rows = sorted(({"key": r.key, "kind": r.kind, "hash_a": r.hash_a, "hash_b": r.hash_b,
                    "value": r.value, "awaiting": list(r.awaiting), "created_at": now}
                   for r in records), key=lambda row: row["key"])
    fresh = [row for row in rows if row["key"] not in refreshed]
    insert_ignoring_conflicts(session, KeptComparison.__table__, fresh, keys=["key"])
    again = [{"k": row["key"], "v": row["value"], "w": row["awaiting"], "t": now}
             for row in rows if row["key"] in refreshed]
    if again:
        session.execute(
            update(KeptComparison.__table__)
            .where(KeptComparison.__table__.c.key == bindparam("k"))
            .values(value=bindparam("v"), awaiting=bindparam("w"), created_at=bindparam("t")),
            again)
