"""Queries of the pinned answers and of what pinning, drift and `check` read of the fleet."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import Select, Text, case, cast, distinct, func, select
from sqlalchemy.orm import Session

from numparity_server.analysis.goldens import (
    MIN_HOLDER_NODES,
    STACK_ATTRIBUTES,
    Holding,
    NodeAnswer,
)
from numparity_server.kit.db import chunked
from numparity_server.models import (
    Device,
    Environment,
    Golden,
    GoldenAnswer,
    Latest,
    LatestCount,
    Manifest,
    Node,
    Outcome,
    Result,
    Run,
)


def newest_versions() -> Select[Any]:
    """The id of each subject's newest version."""
    return select(func.max(Golden.id)).group_by(Golden.subject)


def pins_in_force(session: Session) -> list[Golden]:
    """The newest version of each subject that is not an unpin, oldest first."""
    return list(session.scalars(
        select(Golden).where(Golden.id.in_(newest_versions()), Golden.retired.is_(False))
        .order_by(Golden.id)))


def answers_of(session: Session, golden_ids: Iterable[int]) -> dict[int, list[GoldenAnswer]]:
    found: dict[int, list[GoldenAnswer]] = {}
    for part in chunked(sorted(set(golden_ids))):
        for row in session.scalars(select(GoldenAnswer).where(GoldenAnswer.golden_id.in_(part))
                                   .order_by(GoldenAnswer.workload, GoldenAnswer.variant)):
            found.setdefault(row.golden_id, []).append(row)
    return found


def newest_golden_id(session: Session) -> int:
    """The newest version's id (0: none): what a cached `check` answer is kept against."""
    return int(session.scalar(select(func.coalesce(func.max(Golden.id), 0))) or 0)


def golden(session: Session, golden_id: int) -> Golden | None:
    return session.get(Golden, golden_id)


def newest_of_subject(session: Session, subject: str) -> Golden | None:
    return session.scalars(select(Golden).where(Golden.subject == subject)
                           .order_by(Golden.version.desc()).limit(1)).first()


def list_goldens(session: Session, *, suite: str | None, model: str | None,
                 in_force: bool, limit: int, offset: int) -> tuple[list[Golden], int]:
    """Versions newest first, a page of them, and how many there are."""
    query = select(Golden)
    if suite is not None:
        query = query.where(Golden.suite == suite)
    if model is not None:
        query = query.where(Golden.model == model)
    if in_force:
        query = query.where(Golden.id.in_(newest_versions()), Golden.retired.is_(False))
    total = int(session.scalar(select(func.count()).select_from(query.subquery())) or 0)
    rows = session.scalars(query.order_by(Golden.id.desc()).limit(limit).offset(offset))
    return list(rows), total


def answer_counts(session: Session, golden_ids: Sequence[int]) -> dict[int, int]:
    found: dict[int, int] = {}
    for part in chunked(sorted(set(golden_ids))):
        found.update((golden_id, int(count)) for golden_id, count in session.execute(
            select(GoldenAnswer.golden_id, func.count()).where(GoldenAnswer.golden_id.in_(part))
            .group_by(GoldenAnswer.golden_id)))
    return found


def add_golden(session: Session, row: dict[str, Any], answers: Sequence[dict[str, Any]]
               ) -> Golden:
    golden = Golden(**row)
    session.add(golden)
    session.flush()
    session.add_all(GoldenAnswer(golden_id=golden.id, **answer) for answer in answers)
    session.flush()
    return golden


# ---- the fleet ------------------------------------------------------------------------


def promoted(row: Any) -> dict[str, str | None]:
    return {name: getattr(row, name) for name in STACK_ATTRIBUTES}


def environments(session: Session, ids: Iterable[int] | None = None
                 ) -> dict[int, tuple[str, dict[str, str | None]]]:
    """id → (env_key, promoted attributes), of these environments (all: None)."""
    columns = [Environment.id, Environment.env_key,
               *(getattr(Environment, name) for name in STACK_ATTRIBUTES)]
    if ids is None:
        rows: Iterable[Any] = session.execute(select(*columns))
    else:
        rows = [row for part in chunked(sorted(set(ids)))
                for row in session.execute(select(*columns).where(Environment.id.in_(part)))]
    return {row.id: (row.env_key, promoted(row)) for row in rows}


def environment_by_key(session: Session, env_key: str) -> Any | None:
    """(id, env_key, promoted attributes…) of the environment, or None."""
    return session.execute(
        select(Environment.id, Environment.env_key,
               *(getattr(Environment, name) for name in STACK_ATTRIBUTES))
        .where(Environment.env_key == env_key)).first()


def holdings(session: Session, *, suite: str | None = None,
             models: Sequence[str] | None = None,
             environment_ids: Sequence[int] | None = None,
             keys: Iterable[tuple[str, str]] | None = None) -> list[Holding]:
    """The fleet's latest results as ``latest_counts`` counts them, with their outcomes:
    of a suite, device models, environments and (workload, variant) keys when given."""
    query = (select(LatestCount.environment_id, LatestCount.model, Outcome.suite,
                    Outcome.workload, Outcome.workload_version, Outcome.variant,
                    Outcome.status, Outcome.manifest_hash, Outcome.input_hash,
                    Outcome.param_hash, Outcome.repeats_agree, LatestCount.devices,
                    LatestCount.first_node, LatestCount.wall_sum, LatestCount.walls)
             .join(Outcome, Outcome.id == LatestCount.outcome_id)
             .where(LatestCount.devices > 0))
    if suite is not None:
        query = query.where(LatestCount.suite == suite)
    if models is not None:
        query = query.where(LatestCount.model.in_(sorted(set(models))))
    if environment_ids is not None:
        query = query.where(LatestCount.environment_id.in_(sorted(set(environment_ids))))
    if keys is not None:
        wanted = sorted(set(keys))
        if not wanted:
            return []
        query = query.where(LatestCount.workload.in_(sorted({w for w, _ in wanted})),
                            LatestCount.variant.in_(sorted({v for _, v in wanted})))
        chosen = set(wanted)
    else:
        chosen = None
    return [Holding(row.environment_id, row.model, row.suite, row.workload,
                    row.workload_version, row.variant, row.status, row.manifest_hash,
                    row.input_hash, row.param_hash, row.repeats_agree, int(row.devices),
                    row.first_node or "",
                    (row.wall_sum / row.walls) if row.walls else None)
            for row in session.execute(query)
            if chosen is None or (row.workload, row.variant) in chosen]


def node_answers(session: Session, *, suite: str, model: str,
                 environment_ids: Sequence[int],
                 keys: Iterable[tuple[str, str]] | None = None) -> list[NodeAnswer]:
    """Each node's latest ok results of the suite on devices of ``model`` in these
    environments, per outcome (``analysis.goldens.majority_answers`` counts each node
    one voter): a row per node and answer, not per device. Of ``keys`` when given."""
    if not environment_ids:
        return []
    unsteady = func.sum(case((Outcome.repeats_agree.is_(False), 1), else_=0))
    group = (Outcome.workload, Outcome.variant, Outcome.workload_version,
             Outcome.manifest_hash, Outcome.input_hash, Outcome.param_hash, Node.name)
    query = (select(*group, func.count(), unsteady, func.coalesce(func.sum(Latest.wall_s), 0.0),
                    func.count(Latest.wall_s))
             .select_from(Latest)
             .join(Outcome, Outcome.id == Latest.outcome_id)
             .join(Node, Node.id == Latest.node_id)
             .where(Latest.suite == suite, Latest.model == model,
                    Outcome.status == "ok", Outcome.manifest_hash.is_not(None))
             .group_by(*group))
    chosen = None
    if keys is not None:
        chosen = set(keys)
        if not chosen:
            return []
        query = query.where(Latest.workload.in_(sorted({w for w, _ in chosen})),
                            Latest.variant.in_(sorted({v for _, v in chosen})))
    found: list[NodeAnswer] = []
    for part in chunked(sorted(set(environment_ids))):
        found.extend(NodeAnswer(row[6], row[0], row[1], row[2], row[3], row[4], row[5],
                                int(row[7]), int(row[8] or 0), float(row[9] or 0.0),
                                int(row[10] or 0))
                     for row in session.execute(
                         query.where(Latest.environment_id.in_(part)))
                     if chosen is None or (row[0], row[1]) in chosen)
    return found


def split_keys(session: Session, suite: str, keys: Iterable[tuple[str, str]]
               ) -> set[tuple[str, str]]:
    """Of ``keys``, the (workload, variant) keys on which the fleet splits: two or more
    ok answers among the latest results of the suite (any environment and device model)
    each given by at least ``MIN_HOLDER_NODES`` nodes. Nodes are counted, not devices or
    manifests: an answer one node alone gives (invented, or its own fault) splits
    nothing, so it cannot reorder what other nodes' checks compare first."""
    wanted = set(keys)
    if not wanted:
        return set()
    holders = (select(Latest.workload, Latest.variant, Outcome.manifest_hash)
               .join(Outcome, Outcome.id == Latest.outcome_id)
               .where(Latest.suite == suite, Outcome.status == "ok",
                      Outcome.manifest_hash.is_not(None),
                      Latest.workload.in_(sorted({w for w, _ in wanted})),
                      Latest.variant.in_(sorted({v for _, v in wanted})))
               .group_by(Latest.workload, Latest.variant, Outcome.manifest_hash)
               .having(func.count(distinct(Latest.node_id)) >= MIN_HOLDER_NODES)
               .subquery())
    return {(workload, variant) for workload, variant in session.execute(
        select(holders.c.workload, holders.c.variant)
        .group_by(holders.c.workload, holders.c.variant)
        .having(func.count() > 1))
        if (workload, variant) in wanted}


# How a manifest's JSON (both databases store the text json.dumps wrote) says that an
# entry is a layer's output: a name holding these characters is written with escapes.
_LAYER_ENTRY = '%"kind": "layer"%'


def layered_manifests(session: Session, hashes: Iterable[str]) -> set[str]:
    """Those of the manifests that record a layer: the database answers, so a ranking
    reads no manifest's entries (up to MiBs each) to learn one bit of each."""
    found: set[str] = set()
    for part in chunked(sorted(set(hashes))):
        found.update(session.scalars(
            select(Manifest.hash).where(Manifest.hash.in_(part),
                                        cast(Manifest.entries, Text).like(_LAYER_ENTRY))))
    return found


def run_results(session: Session, run_id: str) -> tuple[Any, list[Any]] | None:
    """The run (its id, environment and env_key) and its results with their outcomes and
    devices (slot, model), or None for an unknown run."""
    run = session.execute(
        select(Run.id, Run.run_id, Run.environment_id, Environment.env_key,
               *(getattr(Environment, name) for name in STACK_ATTRIBUTES))
        .join(Environment, Environment.id == Run.environment_id)
        .where(Run.run_id == run_id)).first()
    if run is None:
        return None
    results = session.execute(
        select(Outcome.suite, Outcome.workload, Outcome.workload_version, Outcome.variant,
               Outcome.device, Outcome.status, Outcome.manifest_hash, Outcome.input_hash,
               Outcome.param_hash, Device.model)
        .select_from(Result)
        .join(Outcome, Outcome.id == Result.outcome_id)
        .join(Device, Device.id == Result.device_id, isouter=True)
        .where(Result.run_pk == run.id).order_by(Result.id)).all()
    return run, list(results)


def node_environment(session: Session, name: str) -> Any | None:
    """The environment of the node's newest run (id, env_key, promoted attributes…)."""
    return session.execute(
        select(Environment.id, Environment.env_key,
               *(getattr(Environment, attribute) for attribute in STACK_ATTRIBUTES))
        .join(Node, Node.environment_id == Environment.id).where(Node.name == name)).first()


def check_version(session: Session) -> tuple[int, int]:
    """(newest pin version's id, newest run's id) in one statement: a `check` answer is
    kept per pin version, against the newest run."""
    row = session.execute(select(
        select(func.coalesce(func.max(Golden.id), 0)).scalar_subquery(),
        select(func.coalesce(func.max(Run.id), 0)).scalar_subquery())).one()
    return int(row[0]), int(row[1])
