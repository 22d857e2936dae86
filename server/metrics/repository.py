"""Queries behind the fleet metrics: each aggregates in the database and returns few rows
(or one row per node), so a scrape of a 10,000-node lab stays cheap."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import and_, func, or_, select, true
from sqlalchemy.orm import Session

from numparity_server.analysis.inputs import Inputs
from numparity_server.kit.db import lookup
from numparity_server.models import Latest, Manifest, Node, Outcome

Key = tuple[str, str, str]  # suite, workload, variant


def latest_ok_answers(session: Session) -> Sequence[Any]:
    """The fleet's latest ok results by outcome, a few hundred rows: (suite, workload,
    variant, workload_version, input_hash, param_hash, manifest_hash, nodes)."""
    per_outcome = (
        select(Latest.suite, Latest.workload, Latest.variant, Latest.outcome_id,
               func.count().label("nodes"))
        .group_by(Latest.suite, Latest.workload, Latest.variant, Latest.outcome_id)
        .subquery()
    )
    return session.execute(
        select(per_outcome.c.suite, per_outcome.c.workload, per_outcome.c.variant,
               Outcome.workload_version, Outcome.input_hash, Outcome.param_hash,
               Outcome.manifest_hash, per_outcome.c.nodes)
        .join(Outcome, Outcome.id == per_outcome.c.outcome_id)
        .where(Outcome.status == "ok", Outcome.manifest_hash.is_not(None))
    ).all()


def first_inputs_by_node_name(session: Session, *, key: Key, workload_version: int | None,
                              candidates: Iterable[Inputs]) -> Inputs | None:
    """Of the key's latest ok results holding one of ``candidates`` (input and parameter
    hashes), those of the first node by name, in the database's collation as /divergence
    orders its nodes."""
    suite, workload, variant = key
    held = [and_(Outcome.input_hash.is_not_distinct_from(input_hash),
                 Outcome.param_hash.is_not_distinct_from(param_hash))
            for input_hash, param_hash in candidates]
    version = (Outcome.workload_version == workload_version if workload_version is not None
               else true())
    row = session.execute(
        select(Outcome.input_hash, Outcome.param_hash)
        .select_from(Latest)
        .join(Outcome, Outcome.id == Latest.outcome_id)
        .join(Node, Node.id == Latest.node_id)
        .where(Latest.suite == suite, Latest.workload == workload, Latest.variant == variant,
               Outcome.status == "ok", Outcome.manifest_hash.is_not(None), version,
               or_(*held))
        .order_by(Node.name)
        .limit(1)
    ).first()
    return (row.input_hash, row.param_hash) if row is not None else None


def manifest_entries(session: Session, hashes: Iterable[str]) -> dict[str, list[Any]]:
    return lookup(session, Manifest.hash, Manifest.entries, hashes)


def node_last_runs(session: Session) -> Sequence[Any]:
    """Every node: (name, newest_started_at, last_seen)."""
    return session.execute(
        select(Node.name, Node.newest_started_at, Node.last_seen).order_by(Node.name)
    ).all()
