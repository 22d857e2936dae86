"""``latest_counts``: ``latest`` counted by (environment, outcome, device model), moved by
ingest in the transaction that moves the node's latest rows (design §3.1).

An upload reads the node's latest rows before it writes them, works out what they are
after (``after_upload``: the rule ``upsert_latest`` applies) and moves the counts by the
difference: a node that keeps its answers moves only the wall time sums of
its rows' counts, one that changed an answer moves a device from one count to another.
Only the node's own rows are read, and the node's row is locked by then (its upsert), so
two uploads of one node never interleave; counts of many nodes are written in key order,
one statement, so concurrent uploads lock them in one order.

``first_node`` is the first node name (code point order) among a count's rows: a node
that comes takes it when its name sorts first; when the node holding it leaves, the
first name is read again from ``latest`` (its index on ``outcome_id``), which happens
about ln(n) times while n nodes leave a count in any order.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import and_, case, delete, func, insert, literal, select, update
from sqlalchemy.orm import Session

from numparity_server.kit.db import codepoint_order, dialect_insert
from numparity_server.models import Latest, LatestCount, Node

CountKey = tuple[int, int, str]  # environment_id, outcome_id, model
_SUMS = ("devices", "wall_sum", "wall_sq_sum", "walls", "spread_sum", "spreads")


@dataclass
class Tally:
    """What some latest rows add to one count."""

    suite: str
    workload: str
    variant: str
    devices: int = 0
    wall_sum: float = 0.0
    wall_sq_sum: float = 0.0
    walls: int = 0
    spread_sum: float = 0.0
    spreads: int = 0

    def add(self, wall_s: float | None, spread: float | None, sign: int = 1) -> None:
        self.devices += sign
        if wall_s is not None:
            self.wall_sum += sign * wall_s
            self.wall_sq_sum += sign * wall_s * wall_s
            self.walls += sign
        if spread is not None:
            self.spread_sum += sign * spread
            self.spreads += sign

    @property
    def moves(self) -> bool:
        return any(getattr(self, name) for name in _SUMS)


class Held(NamedTuple):
    """One of a node's latest rows, as the counts see it."""

    device_id: int
    suite: str
    workload: str
    variant: str
    started_at: datetime
    environment_id: int
    outcome_id: int
    model: str
    wall_s: float | None
    wall_s_spread: float | None

    @property
    def slot(self) -> tuple[int, str, str, str]:
        return (self.device_id, self.suite, self.workload, self.variant)


def node_rows(session: Session, node_id: int) -> list[Held]:
    """The node's latest rows (its unique key leads with node_id)."""
    return [Held(**row._mapping) for row in session.execute(
        select(Latest.device_id, Latest.suite, Latest.workload, Latest.variant,
               Latest.started_at, Latest.environment_id, Latest.outcome_id, Latest.model,
               Latest.wall_s, Latest.wall_s_spread)
        .where(Latest.node_id == node_id))]


def after_upload(before: Sequence[Held], *, gone: Collection[int],
                 rows: Iterable[Mapping[str, Any]]) -> list[Held]:
    """The node's latest rows once an upload wrote ``rows`` (``upsert_latest``'s: a row
    takes a key unless the key holds a newer one) after the devices ``gone`` left it
    (``detach_devices`` deleted their rows): what reading them again would give."""
    held = {row.slot: row for row in before if row.device_id not in gone}
    for row in rows:
        new = Held(**{name: row[name] for name in Held._fields})
        old = held.get(new.slot)
        if old is None or old.started_at <= new.started_at:
            held[new.slot] = new
    return list(held.values())


def difference(before: Iterable[Any], after: Iterable[Any]) -> dict[CountKey, Tally]:
    """How the counts move when a node's latest rows go from ``before`` to ``after``: the
    keys that move (a count whose rows only stayed does not)."""
    moved: dict[CountKey, Tally] = {}
    for rows, sign in ((before, -1), (after, 1)):
        for row in rows:
            key = (int(row.environment_id), int(row.outcome_id), row.model)
            tally = moved.get(key)
            if tally is None:
                tally = moved[key] = Tally(row.suite, row.workload, row.variant)
            tally.add(row.wall_s, row.wall_s_spread, sign)
    return {key: tally for key, tally in moved.items() if tally.moves}


def move(session: Session, *, node: str, before: Sequence[Any], after: Sequence[Any]) -> None:
    """Move the counts from the node's rows ``before`` to its rows ``after``."""
    moved = difference(before, after)
    if not moved:
        return
    holds = {(int(row.environment_id), int(row.outcome_id), row.model) for row in after}
    session.execute(_add_statement(session.get_bind().dialect.name), [
        {"environment_id": key[0], "outcome_id": key[1], "model": key[2],
         "suite": tally.suite, "workload": tally.workload, "variant": tally.variant,
         # The node is a candidate for the first name only where it holds rows now.
         "first_node": node if key in holds else None,
         **{name: getattr(tally, name) for name in _SUMS}}
        for key, tally in sorted(moved.items())])
    left = [key for key in sorted(moved) if key not in holds]
    if left:
        _first_names_again(session, node, left)


@functools.cache
def _add_statement(dialect: str) -> Any:
    table = LatestCount.__table__
    stmt = dialect_insert(dialect, table)
    new = stmt.excluded

    def order(column: Any) -> Any:
        return column.collate("C") if dialect == "postgresql" else column

    updated: dict[str, Any] = {name: table.c[name] + new[name] for name in _SUMS}
    # An outcome's key never changes; set all the same, so a count is never another's.
    updated.update({name: new[name] for name in ("suite", "workload", "variant")})
    # Sums of floats go back to exactly 0 with their count, not to a rounding residue.
    for total, count in (("wall_sum", "walls"), ("wall_sq_sum", "walls"),
                         ("spread_sum", "spreads")):
        updated[total] = case((table.c[count] + new[count] == 0, literal(0.0)),
                              else_=table.c[total] + new[total])
    updated["first_node"] = case(
        (and_(new.first_node.is_not(None),
              table.c.first_node.is_(None) | (order(new.first_node) < order(table.c.first_node))),
         new.first_node),
        else_=table.c.first_node)
    return stmt.on_conflict_do_update(
        index_elements=["environment_id", "outcome_id", "model"], set_=updated)


def _first_names_again(session: Session, node: str, keys: Sequence[CountKey]) -> None:
    """The counts the node left whose first name was the node's: read it from ``latest``
    again (these count rows are locked by this transaction's update already)."""
    table = LatestCount.__table__
    for environment_id, outcome_id, model in keys:
        where = and_(table.c.environment_id == environment_id,
                     table.c.outcome_id == outcome_id, table.c.model == model)
        if session.scalar(select(table.c.first_node).where(where)) != node:
            continue
        first = session.scalar(
            select(func.min(codepoint_order(session, Node.name)))
            .select_from(Latest).join(Node, Node.id == Latest.node_id)
            .where(Latest.outcome_id == outcome_id, Latest.environment_id == environment_id,
                   Latest.model == model))
        session.execute(update(table).where(where).values(first_node=first))


def rebuild(session: Session) -> int:
    """Count ``latest`` again from scratch (after rows were written around ingest: a bulk
    load, a repair); returns the number of counts."""
    table = LatestCount.__table__
    session.execute(delete(table))
    group = (Latest.environment_id, Latest.outcome_id, Latest.model, Latest.suite,
             Latest.workload, Latest.variant)
    session.execute(insert(table).from_select(
        [*(column.name for column in group), "devices", "first_node", "wall_sum",
         "wall_sq_sum", "walls", "spread_sum", "spreads"],
        select(*group, func.count(), func.min(codepoint_order(session, Node.name)),
               func.coalesce(func.sum(Latest.wall_s), 0.0),
               func.coalesce(func.sum(Latest.wall_s * Latest.wall_s), 0.0),
               func.count(Latest.wall_s), func.coalesce(func.sum(Latest.wall_s_spread), 0.0),
               func.count(Latest.wall_s_spread))
        .select_from(Latest).join(Node, Node.id == Latest.node_id).group_by(*group)))
    return session.scalar(select(func.count()).select_from(table)) or 0
