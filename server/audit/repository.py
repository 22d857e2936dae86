"""Queries behind GET /audit. Each aggregates in the database and returns few rows:
the audit of 10,000 nodes must not pull their 360,000 latest results into Python."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Integer, cast, false, func, select, true
from sqlalchemy.orm import Session

from numparity_server.kit.db import chunked
from numparity_server.models import Environment, Latest, Node, Outcome, Result, Run

STRICT = "strict"
_KEY = (Outcome.suite, Outcome.workload, Outcome.workload_version, Outcome.device)


def _latest_results() -> Any:
    """latest ⋈ results ⋈ outcomes ⋈ runs, to select from."""
    return (
        select()
        .select_from(Latest)
        .join(Result, Result.id == Latest.result_id)
        .join(Outcome, Outcome.id == Result.outcome_id)
        .join(Run, Run.id == Result.run_id)
    )


def nodes(session: Session) -> Sequence[Any]:
    return session.execute(select(Node.id, Node.name, Node.last_seen)).all()


def environments(session: Session) -> Sequence[Any]:
    return session.execute(
        select(Environment.id, Environment.env_key, Environment.gpu_name,
               Environment.compute_capability, Environment.driver, Environment.cuda,
               Environment.cudnn, Environment.torch, Environment.cpu_capability,
               Environment.document)
    ).all()


def current_runs(session: Session) -> Sequence[Any]:
    """Every run that holds some node's latest result: (node_id, run_id, environment_id,
    started_at). The newest of a node's is its current environment."""
    held = select(Result.run_id).join(Latest, Latest.result_id == Result.id).distinct()
    return session.execute(
        select(Run.node_id, Run.run_id, Run.environment_id, Run.started_at)
        .where(Run.id.in_(held.scalar_subquery()))
    ).all()


def strict_answer_counts(session: Session) -> Sequence[Any]:
    """(environment_id, suite, workload, version, device, manifest_hash, nodes) over the
    nodes' latest ok strict results."""
    query = _latest_results().add_columns(
        Run.environment_id, *_KEY, Outcome.manifest_hash, func.count()
    ).where(Latest.variant == STRICT, Outcome.status == "ok").group_by(
        Run.environment_id, *_KEY, Outcome.manifest_hash)
    return session.execute(query).all()


def strict_peer_runs(session: Session, majority_manifests: Sequence[str]) -> Sequence[Any]:
    """One run per (environment_id, key, manifest) among latest strict results holding
    one of the given manifests: a peer to compare a suspect with."""
    rows: list[Any] = []
    for part in chunked(sorted(set(majority_manifests))):
        query = _latest_results().add_columns(
            Run.environment_id, *_KEY, Outcome.manifest_hash, func.min(Run.run_id)
        ).where(Latest.variant == STRICT, Outcome.manifest_hash.in_(part)).group_by(
            Run.environment_id, *_KEY, Outcome.manifest_hash)
        rows.extend(session.execute(query).all())
    return rows


def strict_deviations(session: Session, *, environments: Sequence[int],
                      majority_manifests: Sequence[str], since: datetime) -> Sequence[Any]:
    """Strict ok results since ``since`` in the given environments whose manifest is no
    environment's majority answer, per (node, environment, key, manifest): runs, drill
    runs, the newest run id."""
    rows: list[Any] = []
    majority = sorted(set(majority_manifests))
    for part in chunked(sorted(set(environments))):
        query = (
            select(Node.name, Run.environment_id, *_KEY, Outcome.manifest_hash,
                   func.count(), func.sum(cast(Run.drill, Integer)), func.max(Run.run_id))
            .select_from(Result)
            .join(Outcome, Outcome.id == Result.outcome_id)
            .join(Run, Run.id == Result.run_id)
            .join(Node, Node.id == Run.node_id)
            .where(Outcome.variant == STRICT, Outcome.status == "ok",
                   Run.started_at >= since, Run.environment_id.in_(part),
                   Outcome.manifest_hash.not_in(majority) if majority else true())
            .group_by(Node.name, Run.environment_id, *_KEY, Outcome.manifest_hash)
        )
        rows.extend(session.execute(query).all())
    return rows


def latest_deviating(session: Session, manifests: Sequence[str]) -> set[tuple[str, str]]:
    """(node name, manifest_hash) of latest strict results holding one of ``manifests``."""
    found: set[tuple[str, str]] = set()
    for part in chunked(sorted(set(manifests))):
        query = _latest_results().add_columns(Node.name, Outcome.manifest_hash).join(
            Node, Node.id == Latest.node_id
        ).where(Latest.variant == STRICT, Outcome.manifest_hash.in_(part))
        found.update((name, digest) for name, digest in session.execute(query))
    return found


def strict_changes(session: Session, *, since: datetime) -> Sequence[Any]:
    """(node, env_key, suite, workload, version, device, distinct manifests, newest run)
    where a node's strict answer changed within one environment since ``since``
    (drill runs left out)."""
    query = (
        select(Node.name, Environment.env_key, *_KEY,
               func.count(Outcome.manifest_hash.distinct()), func.max(Run.run_id))
        .select_from(Result)
        .join(Outcome, Outcome.id == Result.outcome_id)
        .join(Run, Run.id == Result.run_id)
        .join(Node, Node.id == Run.node_id)
        .join(Environment, Environment.id == Run.environment_id)
        .where(Outcome.variant == STRICT, Outcome.status == "ok", Run.drill == false(),
               Run.started_at >= since)
        .group_by(Node.name, Environment.env_key, *_KEY)
        .having(func.count(Outcome.manifest_hash.distinct()) > 1)
    )
    return session.execute(query).all()


def repeat_disagreements(session: Session) -> Sequence[Any]:
    """Latest results whose repeats disagree: (node, suite, workload, version, variant,
    device, repeats, run_id)."""
    query = _latest_results().add_columns(
        Node.name, Outcome.suite, Outcome.workload, Outcome.workload_version,
        Outcome.variant, Outcome.device, Outcome.repeats, Run.run_id,
    ).join(Node, Node.id == Latest.node_id).where(Outcome.repeats_agree == false())
    return session.execute(query).all()


def input_hash_counts(session: Session) -> Sequence[Any]:
    """(suite, workload, version, variant, input_hash, param_hash, nodes) over latest ok
    results."""
    columns = (Outcome.suite, Outcome.workload, Outcome.workload_version, Outcome.variant,
               Outcome.input_hash, Outcome.param_hash)
    query = _latest_results().add_columns(*columns, func.count()).where(
        Outcome.status == "ok").group_by(*columns)
    return session.execute(query).all()


def nodes_with_inputs(session: Session, *, suite: str, workload: str, version: int | None,
                      variant: str, input_hash: str | None, param_hash: str | None
                      ) -> Sequence[Any]:
    """(node, run_id) of latest ok results of the key with these input and param hashes."""
    query = _latest_results().add_columns(Node.name, Run.run_id).join(
        Node, Node.id == Latest.node_id
    ).where(
        Outcome.status == "ok", Outcome.suite == suite, Outcome.workload == workload,
        Outcome.variant == variant,
        Outcome.workload_version.is_(None) if version is None
        else Outcome.workload_version == version,
        Outcome.input_hash.is_(None) if input_hash is None else Outcome.input_hash == input_hash,
        Outcome.param_hash.is_(None) if param_hash is None else Outcome.param_hash == param_hash,
    ).order_by(Node.name)
    return session.execute(query).all()


def wall_times(session: Session, variants: Sequence[str]) -> Sequence[Any]:
    """(environment_id, workload, variant, mean wall_s, nodes) over latest ok results."""
    query = _latest_results().add_columns(
        Run.environment_id, Outcome.workload, Outcome.variant, func.avg(Result.wall_s),
        func.count(Latest.node_id.distinct()),
    ).where(Outcome.status == "ok", Latest.variant.in_(variants),
            Result.wall_s.is_not(None)).group_by(
        Run.environment_id, Outcome.workload, Outcome.variant)
    return session.execute(query).all()


def environment_changes(session: Session, *, since: datetime) -> Sequence[Any]:
    """Consecutive runs of one node (by started_at) on different environments since
    ``since``: (node, run id, run_id, previous run id, previous run_id, started_at,
    environment_id, previous environment_id)."""
    ordered = (
        select(
            Run.node_id, Run.id, Run.run_id, Run.started_at, Run.environment_id,
            func.lag(Run.environment_id).over(
                partition_by=Run.node_id, order_by=(Run.started_at, Run.id)).label("prev_env"),
            func.lag(Run.id).over(
                partition_by=Run.node_id, order_by=(Run.started_at, Run.id)).label("prev_id"),
            func.lag(Run.run_id).over(
                partition_by=Run.node_id, order_by=(Run.started_at, Run.id)).label("prev_run"),
        )
        .where(Run.started_at >= since)
        .subquery()
    )
    query = (
        select(Node.name, ordered.c.id, ordered.c.run_id, ordered.c.prev_id, ordered.c.prev_run,
               ordered.c.started_at, ordered.c.environment_id, ordered.c.prev_env)
        .join(Node, Node.id == ordered.c.node_id)
        .where(ordered.c.prev_env.is_not(None), ordered.c.prev_env != ordered.c.environment_id)
        .order_by(ordered.c.started_at.desc(), Node.name)
    )
    return session.execute(query).all()

