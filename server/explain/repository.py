"""Queries of the explain routes: the reference run as explain reads it, the run and node
a findings document names, and the findings' rows."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from numparity_server.models import Environment, Explanation, Node, Outcome, Result, Run
from numparity_server.reads.results import manifest_entries


@dataclass(frozen=True)
class ReferenceRun:
    pk: int
    run_id: str
    node_id: int
    env_key: str
    environment: dict[str, Any]


@dataclass(frozen=True)
class ReferenceResultRow:
    suite: str
    workload: str
    workload_version: int | None
    variant: str
    device: str
    input_hash: str | None
    param_hash: str | None
    manifest_hash: str


def reference_run(session: Session, run_id: str) -> ReferenceRun | None:
    row = session.execute(
        select(Run.id, Run.run_id, Run.node_id, Environment.env_key, Environment.document)
        .join(Environment, Environment.id == Run.environment_id)
        .where(Run.run_id == run_id)
    ).one_or_none()
    return None if row is None else ReferenceRun(*row)


def ok_results(session: Session, run_pk: int, *, workload: str | None = None,
               variant: str | None = None) -> list[ReferenceResultRow]:
    """The run's ok results that have tensors, in the order of its document."""
    query = (
        select(Outcome.suite, Outcome.workload, Outcome.workload_version, Outcome.variant,
               Outcome.device, Outcome.input_hash, Outcome.param_hash, Outcome.manifest_hash)
        .join(Result, Result.outcome_id == Outcome.id)
        .where(Result.run_pk == run_pk, Outcome.status == "ok",
               Outcome.manifest_hash.is_not(None))
        .order_by(Result.id)
    )
    if workload is not None:
        query = query.where(Outcome.workload == workload)
    if variant is not None:
        query = query.where(Outcome.variant == variant)
    return [ReferenceResultRow(*row) for row in session.execute(query)]


def manifests(session: Session, hashes: Iterable[str]) -> dict[str, list[dict[str, Any]]]:
    """Manifest hash -> its entries ({name, kind, hash}) in execution order."""
    return manifest_entries(session, hashes)


@dataclass(frozen=True)
class ExplainingNode:
    id: int
    environment_id: int | None


def node_by_name(session: Session, name: str) -> ExplainingNode | None:
    row = session.execute(
        select(Node.id, Node.environment_id).where(Node.name == name)).one_or_none()
    return None if row is None else ExplainingNode(*row)


def environment_id(session: Session, env_key: str) -> int | None:
    found: int | None = session.execute(
        select(Environment.id).where(Environment.env_key == env_key)).scalar_one_or_none()
    return found


def insert_explanations(session: Session, rows: Sequence[dict[str, Any]]) -> None:
    """One statement for every finding of a document (at most 256)."""
    if rows:
        session.execute(insert(Explanation), list(rows))
