"""Queries and bulk writes of the ingest path."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, case, delete, func, insert, select, true, update
from sqlalchemy.orm import Session, aliased

from numparity_server.kit.db import chunked, dialect_insert, insert_ignoring_conflicts
from numparity_server.models import (
    STAT_FIELDS,
    Device,
    Environment,
    Fingerprint,
    Latest,
    Manifest,
    Node,
    Outcome,
    Result,
    Run,
    Trace,
)


def find_run(session: Session, run_id: str) -> Run | None:
    return session.scalar(select(Run).where(Run.run_id == run_id))


def count_results(session: Session, run_pk: int) -> int:
    query = select(func.count()).select_from(Result).where(Result.run_pk == run_pk)
    return session.scalar(query) or 0


def upsert_node(session: Session, *, name: str, labels: dict[str, Any], seen_at: datetime,
                environment_id: int, started_at: datetime) -> int:
    """Insert or refresh the node (labels, last_seen never going back; the environment of
    its newest run, and when a run came on another environment); its id. One statement."""
    stmt = _upsert_node_statement(session.get_bind().dialect.name)
    params = {"name": name, "labels": labels, "first_seen": seen_at, "last_seen": seen_at,
              "environment_id": environment_id, "newest_started_at": started_at}
    return int(session.execute(stmt, params).scalar_one())


@functools.cache
def _upsert_node_statement(dialect: str) -> Any:
    # Built once per backend: constructing ON CONFLICT ... excluded costs more than running it.
    # Every SET expression reads the row as it was before this statement.
    table = Node.__table__
    stmt = dialect_insert(dialect, table)
    new = stmt.excluded
    newer = (table.c.newest_started_at.is_(None)
             | (new.newest_started_at >= table.c.newest_started_at))
    newest = case((newer, new.newest_started_at), else_=table.c.newest_started_at)
    return stmt.on_conflict_do_update(
        index_elements=["name"],
        set_={"labels": new.labels,
              "last_seen": case((table.c.last_seen > new.last_seen, table.c.last_seen),
                                else_=new.last_seen),
              "environment_id": case((newer, new.environment_id),
                                     else_=table.c.environment_id),
              "newest_started_at": newest,
              # A run on another environment than the node's current one, whatever the
              # order runs arrive in (a spool may send an older run late): the node
              # changed environment; /audit reads its runs for drift.
              "environment_changed_at": case(
                  (new.environment_id != table.c.environment_id, newest),
                  else_=table.c.environment_changed_at)},
    ).returning(table.c.id)


def resolve_devices(session: Session, *, node_id: int, rows: Sequence[dict[str, Any]],
                    started_at: datetime, seen_at: datetime) -> tuple[dict[str, int], list[str]]:
    """slot → devices.id for this run's devices (``rows``: identity, type, model, uuid,
    serial, pci_bus_id, name, compute_capability, mig, slot), inserting the new ones;
    and the identities this node claims (second).

    A physical device (a ``uuid:`` or ``serial:`` identity) belongs to the node that
    reported it first (``owner_node_id``). When it belongs to another node, this node's
    results of it go to a device row of this node's own, ``claim:<node id>/<identity>``
    (``claim_of`` the owned device): they count for this node and never touch the owned
    device's history or where it sits, until an admin confirms the move
    (`numparity-server device move`, ``confirm_claim``).

    A UUID the server does not know, on a board of this node whose serial it knows under
    another UUID (a virtual machine may give a GPU a new UUID), is that device: its row
    takes the new UUID. Only a device sitting on this node is taken so: another node
    claiming its serial cannot take over its history. A device whose newest run this is
    sits on this node now, at this slot.
    """
    if not rows:  # a run without results names no device (an executemany needs rows)
        return {}, []
    by_identity = {row["identity"]: row for row in rows}
    found = _device_ids(session, by_identity)
    for identity, row in by_identity.items():
        if identity in found or not (row["uuid"] and row["serial"]) or row["mig"]:
            continue
        known = session.execute(
            select(Device.id, Device.identity)
            .where(Device.serial == row["serial"], Device.type == row["type"],
                   Device.mig.is_(False), Device.identity.like("uuid:%"),
                   Device.node_id == node_id, Device.owner_node_id == node_id)
        ).all()
        if len(known) == 1:
            session.execute(update(Device).where(Device.id == known[0].id)
                            .values(identity=identity, uuid=row["uuid"]))
            found[identity] = int(known[0].id)
    new = [{**row, "node_id": node_id, "owner_node_id": node_id, "first_seen": seen_at,
            "last_seen": seen_at, "newest_started_at": started_at}
           for identity, row in sorted(by_identity.items()) if identity not in found]
    if new:
        insert_ignoring_conflicts(session, Device.__table__, new, keys=["identity"])
        found.update(_device_ids(session, [row["identity"] for row in new]))
    claimed = _claims(session, node_id=node_id, found=found, rows=by_identity,
                      started_at=started_at, seen_at=seen_at)
    session.execute(_place_devices_statement(), [
        {"b_id": found[identity], "b_node": node_id, "b_slot": row["slot"],
         "b_started": started_at, "b_seen": seen_at, "b_model": row["model"],
         "b_pci": row["pci_bus_id"], "b_name": row["name"],
         "b_cc": row["compute_capability"]}
        for identity, row in by_identity.items()])
    return ({row["slot"]: found[identity] for identity, row in by_identity.items()},
            claimed)


def claim_identity(node_id: int, identity: str) -> str:
    return f"claim:{node_id}/{identity}"


def _claims(session: Session, *, node_id: int, found: dict[str, int],
            rows: dict[str, dict[str, Any]], started_at: datetime,
            seen_at: datetime) -> list[str]:
    """Points ``found``'s devices that belong to another node at this node's claim rows
    (inserting the new ones); a device no node owns yet (stored before owners, and no
    node held it) becomes this node's. The identities claimed."""
    physical = {identity: pk for identity, pk in found.items()
                if identity.startswith(("uuid:", "serial:"))}
    if not physical:
        return []
    owners: dict[int, int | None] = {int(pk): owner for pk, owner in session.execute(
        select(Device.id, Device.owner_node_id).where(Device.id.in_(sorted(physical.values()))))}
    unowned = sorted(pk for pk in physical.values() if owners.get(pk) is None)
    if unowned:
        session.execute(update(Device).where(Device.id.in_(unowned),
                                             Device.owner_node_id.is_(None))
                        .values(owner_node_id=node_id))
        owners.update({int(pk): owner for pk, owner in session.execute(
            select(Device.id, Device.owner_node_id).where(Device.id.in_(unowned)))})
    claimed = sorted(identity for identity, pk in physical.items()
                     if owners.get(pk) not in (None, node_id))
    if not claimed:
        return []
    claim_rows = {claim_identity(node_id, identity): identity for identity in claimed}
    insert_ignoring_conflicts(session, Device.__table__, [
        {**rows[identity], "identity": claim, "uuid": None, "serial": None,
         "node_id": node_id, "owner_node_id": node_id, "claim_of": physical[identity],
         "first_seen": seen_at, "last_seen": seen_at, "newest_started_at": started_at}
        for claim, identity in sorted(claim_rows.items())], keys=["identity"])
    for claim, pk in _device_ids(session, claim_rows).items():
        found[claim_rows[claim]] = pk
    return claimed


@functools.cache
def _place_devices_statement() -> Any:
    """One UPDATE per device, sent as one executemany: a device whose newest run this is
    sits at this node and slot now (and its description is this run's; ``moved_at`` when
    that is another node); last_seen never goes back."""
    table = Device.__table__
    newer = (table.c.newest_started_at.is_(None)
             | (table.c.newest_started_at <= bindparam("b_started")))

    def if_newer(column: str, value: str) -> Any:
        return case((newer, bindparam(value)), else_=table.c[column])

    # Another node than the one it sat on (or none, once it left): it moved.
    moved = newer & table.c.newest_started_at.is_not(None) & (
        table.c.node_id.is_(None) | (table.c.node_id != bindparam("b_node")))
    return (update(table).where(table.c.id == bindparam("b_id")).values(
        moved_at=case((moved, bindparam("b_started")), else_=table.c.moved_at),
        node_id=if_newer("node_id", "b_node"), slot=if_newer("slot", "b_slot"),
        newest_started_at=if_newer("newest_started_at", "b_started"),
        model=if_newer("model", "b_model"), pci_bus_id=if_newer("pci_bus_id", "b_pci"),
        name=if_newer("name", "b_name"),
        compute_capability=if_newer("compute_capability", "b_cc"),
        last_seen=case((table.c.last_seen < bindparam("b_seen"), bindparam("b_seen")),
                       else_=table.c.last_seen)))


def _device_ids(session: Session, identities: Iterable[str]) -> dict[str, int]:
    ids: dict[str, int] = {}
    for part in chunked(sorted(set(identities))):
        ids.update((identity, int(pk)) for identity, pk in session.execute(
            select(Device.identity, Device.id).where(Device.identity.in_(part))))
    return ids


def detach_devices(session: Session, *, node_id: int, started_at: datetime,
                   visible_uuids: set[str]) -> list[int]:
    """The node's newest run saw only ``visible_uuids``: a GPU of this node known by a
    UUID it did not see has left it (replaced, or moved to another node). It no longer
    sits here, and the node's latest results of it go, so the node is judged by the
    devices it has; the device's history stays with the device.

    Only the node's own newest run moves its devices away, so no other node's runs can
    hide this node's devices from the audit. Returns the devices whose rows went."""
    # The GPUs the node holds latest results of (one may sit elsewhere already: it moved
    # and its new node reported first).
    # A claim row (no UUID of its own) is known by the UUID of the device it claims.
    claimed = aliased(Device)
    uuid = func.coalesce(Device.uuid, claimed.uuid)
    gone = session.scalars(
        select(Latest.device_id).distinct()
        .join(Device, Device.id == Latest.device_id)
        .outerjoin(claimed, claimed.id == Device.claim_of)
        .join(Node, Node.id == Latest.node_id)
        .where(Latest.node_id == node_id, Node.newest_started_at <= started_at,
               uuid.is_not(None),
               uuid.not_in(sorted(visible_uuids)) if visible_uuids else true())
    ).all()
    if gone:
        session.execute(delete(Latest).where(Latest.node_id == node_id,
                                             Latest.device_id.in_(gone)))
        session.execute(update(Device).where(Device.id.in_(gone), Device.node_id == node_id)
                        .values(node_id=None))
    return [int(pk) for pk in gone]


def find_environment(session: Session, env_key: str) -> int | None:
    return session.scalar(select(Environment.id).where(Environment.env_key == env_key))


def ensure_environment(session: Session, *, row: dict[str, Any]) -> int:
    insert_ignoring_conflicts(session, Environment.__table__, [row], keys=["env_key"])
    return session.scalars(
        select(Environment.id).where(Environment.env_key == row["env_key"])
    ).one()


def existing_fingerprints(session: Session, hashes: Iterable[str]) -> set[str]:
    return _existing(session, Fingerprint.hash, hashes)


def existing_manifests(session: Session, hashes: Iterable[str]) -> set[str]:
    return _existing(session, Manifest.hash, hashes)


def _existing(session: Session, column: Any, hashes: Iterable[str]) -> set[str]:
    wanted = sorted(set(hashes))
    found: set[str] = set()
    for part in chunked(wanted):
        found.update(session.scalars(select(column).where(column.in_(part))))
    return found


def insert_fingerprints(session: Session, rows: Sequence[dict[str, Any]]) -> None:
    insert_ignoring_conflicts(session, Fingerprint.__table__, rows, keys=["hash"])


def fingerprints_with_values(session: Session, hashes: Iterable[str]) -> set[str]:
    """Of these hashes, the fingerprints stored with their values."""
    wanted = sorted(set(hashes))
    found: set[str] = set()
    for part in chunked(wanted):
        found.update(session.scalars(select(Fingerprint.hash).where(
            Fingerprint.hash.in_(part), Fingerprint.values.is_not(None))))
    return found


def fill_values(session: Session, rows: Sequence[dict[str, Any]]) -> None:
    """Set the values of stored fingerprints that have none (a hash's values are the same
    bytes whoever sends them: the first write wins, later ones change nothing), and the
    statistics computed from them (``STAT_FIELDS`` in ``row``): the node that stored the
    fingerprint first, without values, may have declared others.

    Known tensors re-sent with their values (151,552 one-element tensors made 151,552
    UPDATEs, minutes of the write lock) cost one indexed look-up per 500: only the rows
    whose stored fingerprint lacks values are written, in one statement executed for
    all of them (every row has the same columns)."""
    if not rows:
        return
    lacking: set[str] = set()
    for part in chunked(sorted({row["hash"] for row in rows})):
        lacking.update(session.scalars(select(Fingerprint.hash).where(
            Fingerprint.hash.in_(part), Fingerprint.values.is_(None))))
    wanted = [row for row in rows if row["hash"] in lacking]
    if not wanted:
        return
    table = Fingerprint.__table__
    columns = ["values", "values_dtype", "values_codec",
               *(name for name in STAT_FIELDS if any(name in row for row in wanted))]
    # Bound names must not be the columns' own (SQLAlchemy reserves those for SET).
    statement = (update(table)
                 .where(table.c.hash == bindparam("b_hash"), table.c["values"].is_(None))
                 .values({name: bindparam(f"b_{name}") for name in columns}))
    session.execute(statement, [{f"b_{name}": row.get(name) for name in ("hash", *columns)}
                                for row in wanted])


def insert_manifests(session: Session, rows: Sequence[dict[str, Any]]) -> None:
    insert_ignoring_conflicts(session, Manifest.__table__, rows, keys=["hash"])


def existing_traces(session: Session, hashes: Iterable[str]) -> set[str]:
    return _existing(session, Trace.hash, hashes)


def insert_traces(session: Session, rows: Sequence[dict[str, Any]]) -> None:
    insert_ignoring_conflicts(session, Trace.__table__, rows, keys=["hash"])


def ensure_outcomes(session: Session, rows: Sequence[dict[str, Any]]) -> dict[str, int]:
    """Outcome hash -> id for these outcome rows, inserting the ones the server lacks."""
    wanted = {row["hash"]: row for row in rows}
    ids = _outcome_ids(session, wanted)
    new = [wanted[digest] for digest in sorted(wanted) if digest not in ids]
    if new:
        insert_ignoring_conflicts(session, Outcome.__table__, new, keys=["hash"])
        ids.update(_outcome_ids(session, [row["hash"] for row in new]))
    return ids


def _outcome_ids(session: Session, hashes: Iterable[str]) -> dict[str, int]:
    ids: dict[str, int] = {}
    for part in chunked(sorted(set(hashes))):
        ids.update((digest, int(pk)) for digest, pk in session.execute(
            select(Outcome.hash, Outcome.id).where(Outcome.hash.in_(part))))
    return ids


def insert_run(session: Session, row: dict[str, Any]) -> int:
    table = Run.__table__
    return int(session.execute(insert(table).values(row).returning(table.c.id)).scalar_one())


def insert_results(session: Session, rows: Sequence[dict[str, Any]]) -> list[int]:
    """Insert one run's results; their ids in the rows' order.

    One executemany and one SELECT: a RETURNING that keeps the rows' order makes
    SQLAlchemy send SQLite one INSERT per row. Ids grow in insertion order within the
    transaction, and all rows belong to the one run being written.
    """
    if not rows:
        return []
    table = Result.__table__
    session.execute(insert(table), list(rows))
    run_pk = rows[0]["run_pk"]
    return [int(pk) for pk in session.scalars(
        select(table.c.id).where(table.c.run_pk == run_pk).order_by(table.c.id))]


def upsert_latest(session: Session, rows: Sequence[dict[str, Any]]) -> None:
    """Point (node, device, suite, workload, variant) at these results unless a newer run
    holds it."""
    if rows:
        session.execute(_upsert_latest_statement(session.get_bind().dialect.name), list(rows))


@functools.cache
def _upsert_latest_statement(dialect: str) -> Any:
    table = Latest.__table__
    stmt = dialect_insert(dialect, table)
    return stmt.on_conflict_do_update(
        index_elements=["node_id", "device_id", "suite", "workload", "variant"],
        set_={name: stmt.excluded[name] for name in (
            "result_id", "started_at", "outcome_id", "environment_id", "model", "wall_s",
            "wall_s_spread")},
        where=table.c.started_at <= stmt.excluded.started_at,
    )


def run_summary_rows(
    session: Session, run_id: str
) -> tuple[Run, str, str, list[tuple[Outcome, float | None]]] | None:
    row = session.execute(
        select(Run, Node.name, Environment.env_key)
        .join(Node, Node.id == Run.node_id)
        .join(Environment, Environment.id == Run.environment_id)
        .where(Run.run_id == run_id)
    ).one_or_none()
    if row is None:
        return None
    run, node_name, env_key = row
    results = session.execute(
        select(Outcome, Result.wall_s).join(Outcome, Outcome.id == Result.outcome_id)
        .where(Result.run_pk == run.id).order_by(Result.id)
    ).all()
    return run, node_name, env_key, [(outcome, wall_s) for outcome, wall_s in results]


def manifest_sizes(session: Session, hashes: Iterable[str]) -> dict[str, int]:
    wanted = sorted(set(hashes))
    sizes: dict[str, int] = {}
    for part in chunked(wanted):
        for manifest_hash, count in session.execute(
            select(Manifest.hash, Manifest.tensor_count).where(Manifest.hash.in_(part))
        ):
            sizes[manifest_hash] = count
    return sizes


def list_runs(
    session: Session, *, node: str | None, limit: int, offset: int
) -> tuple[int, Sequence[Any]]:
    """Newest first; the total count for the pager."""
    query = (
        select(Run.id, Run.run_id, Node.name.label("node"), Environment.env_key,
               Run.agent_version, Run.started_at, Run.received_at, Run.drill)
        .join(Node, Node.id == Run.node_id)
        .join(Environment, Environment.id == Run.environment_id)
    )
    if node is not None:
        query = query.where(Node.name == node)
    total = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    rows = session.execute(
        query.order_by(Run.started_at.desc(), Run.id.desc()).limit(limit).offset(offset)
    ).all()
    return total, rows
