"""Queries behind GET /divergence: latest results of a key, and fingerprints by hash."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from numparity_server.kit.db import chunked
from numparity_server.models import (
    Environment,
    Fingerprint,
    Latest,
    Manifest,
    Node,
    Outcome,
    Result,
    Run,
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


def latest_ok_results(
    session: Session, *, suite: str, workload: str, variant: str
) -> list[LatestResult]:
    """Every node's newest result of the key, when that result is ok (it has a manifest)."""
    rows = session.execute(
        select(Node.name, Run.run_id, Environment.env_key, Environment.document, Outcome.device,
               Outcome.workload_version, Outcome.input_hash, Outcome.param_hash,
               Manifest.entries)
        .select_from(Latest)
        .join(Result, Result.id == Latest.result_id)
        .join(Outcome, Outcome.id == Result.outcome_id)
        .join(Run, Run.id == Result.run_id)
        .join(Node, Node.id == Latest.node_id)
        .join(Environment, Environment.id == Run.environment_id)
        .join(Manifest, Manifest.hash == Outcome.manifest_hash)
        .where(Latest.suite == suite, Latest.workload == workload, Latest.variant == variant,
               Outcome.status == "ok")
        .order_by(Node.name)
    ).all()
    return [LatestResult(*row) for row in rows]


def fingerprints(session: Session, hashes: Iterable[str]) -> Sequence[Fingerprint]:
    wanted = sorted(set(hashes))
    rows: list[Fingerprint] = []
    for part in chunked(wanted):
        rows.extend(session.scalars(select(Fingerprint).where(Fingerprint.hash.in_(part))))
    return rows
