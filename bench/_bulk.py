"""Bulk loading of the synthetic lab (bench/_fleet.py) for bench/analysis.py at 100,000
nodes, where the real ingest (~150 runs/s on two cores) would take half an hour a size.

The rows are still the real ingest's: nodes of one **shape** (the environment, fault and
flakiness of each of their runs) store the same rows up to their names, times and wall
times. So the first node of each shape, and every node that cannot be copied (a faulty
GPU's answers are fingerprints of its own), goes through ``Loader`` (the real
``ingest_run``); every other node gets a copy of its shape's exemplar's rows in
``nodes``, ``runs``, ``devices``, ``results`` and ``latest``, with its own ids, names,
``run_id``, document hash, times and wall times (read from the node's own documents).
Content rows (environments, outcomes, manifests, fingerprints) are the exemplars' and are
shared, as ingest shares them. Every time ingest stamps is one of a run's ``started_at``
(its order time) or its receipt (the loader's clock: ``finished_at``); a time of the
exemplar's rows that is neither stops the load rather than guess.

Copies go in with PostgreSQL's COPY (psycopg 3 ``cursor.copy``), chunk by chunk, or
SQLAlchemy Core bulk inserts on SQLite; ids are given explicitly and the sequences moved
past them. ``bench/bulkcheck.py`` checks that a bulk-loaded fleet answers ``/audit`` and
``/divergence`` exactly as the same fleet ingested through HTTP.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from _fleet import Fleet, Loaded, Loader, NodePlan
from psycopg.types.json import Json
from sqlalchemy import Connection, Table, func, select, text
from sqlalchemy.orm import Session

from numparity_server.kit.db import is_sqlite
from numparity_server.models import Device, Latest, Node, Result, Run
from numparity_server.runs import counts
from numparity_server.runs.service import document_sha256

TABLES: tuple[Table, ...] = tuple(model.__table__ for model in (Node, Run, Device, Result,
                                                                Latest))  # type: ignore[misc]
CHUNK_NODES = 2_000


def shape(plan: NodePlan) -> tuple[Any, ...] | None:
    """What a node's stored rows depend on besides its name, times and wall times; None
    for a node whose rows cannot be copied (a faulty GPU's fingerprints are its own)."""
    if any(run.faulty for run in plan.runs):
        return None
    return tuple((run.env, run.flaky) for run in plan.runs)


@dataclass
class Exemplar:
    """One node's stored rows, per table, as ingest wrote them."""

    plan: NodePlan
    rows: dict[str, list[dict[str, Any]]]


class BulkLoader:
    """Grows one database's fleet to ``stop`` nodes: exemplars and uncopyable nodes through
    ``loader`` (the real ingest), the others as copies of their exemplar's rows."""

    def __init__(self, loader: Loader) -> None:
        self.loader = loader
        self.fleet: Fleet = loader.fleet
        self.exemplars: dict[tuple[Any, ...], Exemplar] = {}

    @property
    def runs(self) -> int:
        return self.loader.runs

    def load(self, start: int, stop: int) -> Loaded:
        began = time.monotonic()
        runs_before = self.loader.runs
        plans = [self.fleet.node(index) for index in range(start, stop)]
        real = {plan.index for plan in plans if self._needs_ingest(plan)}
        self.loader.ingest(sorted(real))
        self._read_exemplars([plan for plan in plans if plan.index in real])
        copied = [plan for plan in plans if plan.index not in real]
        for part in range(0, len(copied), CHUNK_NODES):
            self.loader.runs += self._copy(copied[part:part + CHUNK_NODES])
        if copied:
            # The copies' latest rows went in beside ingest: count them as it would have.
            with Session(self.loader.engine) as session, session.begin():
                counts.rebuild(session)
        return Loaded(stop - start, self.loader.runs - runs_before, time.monotonic() - began)

    def _needs_ingest(self, plan: NodePlan) -> bool:
        key = shape(plan)
        if key is None:
            return True
        if key in self.exemplars:
            return False
        self.exemplars[key] = Exemplar(plan, {})  # rows read once it is stored
        return True

    def _read_exemplars(self, plans: Sequence[NodePlan]) -> None:
        wanted = {plan.name for plan in plans if (key := shape(plan)) is not None
                  and self.exemplars[key].plan.index == plan.index}
        with self.loader.engine.connect() as connection:
            for key, exemplar in self.exemplars.items():
                if exemplar.plan.name in wanted:
                    self.exemplars[key] = Exemplar(exemplar.plan,
                                                   _stored_rows(connection, exemplar.plan.name))

    def _copy(self, plans: Sequence[NodePlan]) -> int:
        with self.loader.engine.begin() as connection:
            ids = {table.name: _max_id(connection, table) for table in TABLES}
            rows: dict[str, list[dict[str, Any]]] = {table.name: [] for table in TABLES}
            runs = 0
            for plan in plans:
                exemplar = self.exemplars[shape(plan)]  # type: ignore[index]
                for name, copied in _copy_node(self.fleet, exemplar, plan, ids).items():
                    rows[name].extend(copied)
                runs += len(plan.runs)
            for table in TABLES:
                _write(connection, table, rows[table.name])
            _advance_sequences(connection)
        return runs


def _stored_rows(connection: Connection, name: str) -> dict[str, list[dict[str, Any]]]:
    node = connection.execute(select(Node).where(Node.name == name)).mappings().one()
    runs = connection.execute(select(Run).where(Run.node_id == node["id"])
                              .order_by(Run.id)).mappings().all()
    return {
        "nodes": [dict(node)],
        "runs": [dict(row) for row in runs],
        "devices": [dict(row) for row in connection.execute(
            select(Device).where(Device.node_id == node["id"]).order_by(Device.id)).mappings()],
        "results": [dict(row) for row in connection.execute(
            select(Result).where(Result.run_pk.in_([run["id"] for run in runs]))
            .order_by(Result.id)).mappings()],
        "latest": [dict(row) for row in connection.execute(
            select(Latest).where(Latest.node_id == node["id"]).order_by(Latest.id)).mappings()],
    }


def _copy_node(fleet: Fleet, exemplar: Exemplar, plan: NodePlan, ids: dict[str, int]
               ) -> dict[str, list[dict[str, Any]]]:
    """The exemplar's rows made this node's: new ids (``ids``: the last id used per table,
    advanced here), names, times and wall times."""
    documents = fleet.documents(plan, None)
    times = _time_map(fleet, exemplar.plan, documents)
    renumbered: dict[str, dict[int, int]] = {}
    for table in TABLES:
        renumbered[table.name] = {}
        for row in exemplar.rows[table.name]:
            ids[table.name] += 1
            renumbered[table.name][row["id"]] = ids[table.name]
    walls = [result.get("wall_s") for document, _received in documents
             for result in document["results"]]
    wall_of = dict(zip((row["id"] for row in exemplar.rows["results"]), walls, strict=True))
    references = {"node_id": "nodes", "run_pk": "runs", "device_id": "devices",
                  "result_id": "results"}
    node_id = renumbered["nodes"][exemplar.rows["nodes"][0]["id"]]
    own = {
        "nodes": lambda row: {"name": plan.name,
                              "labels": documents[-1][0]["node"]["labels"]},
        "runs": lambda row: _own_run(documents, exemplar.rows["runs"].index(row)),
        "devices": lambda row: {"identity": re.sub(r"^node:\d+/", f"node:{node_id}/",
                                                   row["identity"])},
        "results": lambda row: {"wall_s": wall_of[row["id"]]},
        "latest": lambda row: {"wall_s": wall_of[row["result_id"]]},
    }
    copied: dict[str, list[dict[str, Any]]] = {}
    for table in TABLES:
        copied[table.name] = [
            {column: _copied_value(column, value, times, renumbered, references)
             for column, value in row.items()}
            | {"id": renumbered[table.name][row["id"]]} | own[table.name](row)
            for row in exemplar.rows[table.name]]
    return copied


def _own_run(documents: list[tuple[dict[str, Any], datetime]], number: int) -> dict[str, Any]:
    document = documents[number][0]
    return {"run_id": document["run_id"],
            "document_sha256": document_sha256(document, [None] * len(document["results"]))}


def _copied_value(column: str, value: Any, times: dict[datetime, datetime],
                  renumbered: dict[str, dict[int, int]], references: dict[str, str]) -> Any:
    if isinstance(value, datetime):
        if value not in times:
            raise RuntimeError(f"{column} {value} is no run's start or receipt: "
                               "the bulk loader cannot place it")
        return times[value]
    if column in references and value is not None:
        return renumbered[references[column]][value]
    return value


def _time_map(fleet: Fleet, exemplar: NodePlan,
              documents: list[tuple[dict[str, Any], datetime]]) -> dict[datetime, datetime]:
    """Each time ingest stamped on the exemplar's rows → the same moment of this node: a
    run's start and end as its document says (the start is also its order time: the
    fleet's runs never start after they are received) and its receipt (the loader's
    clock: the end, to the microsecond)."""
    mine = fleet.documents(exemplar, None)
    found: dict[datetime, datetime] = {}
    for (theirs, received), (ours, our_received) in zip(mine, documents, strict=True):
        for field in ("started_at", "finished_at"):  # as the documents say, to the second
            found[_parse(theirs[field])] = _parse(ours[field])
        found[received] = our_received
    return found


def _parse(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def _max_id(connection: Connection, table: Table) -> int:
    return int(connection.scalar(select(func.coalesce(func.max(table.c.id), 0))) or 0)


def _write(connection: Connection, table: Table, rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    if is_sqlite(str(connection.engine.url)):
        connection.execute(table.insert(), rows)
        return
    columns = [column.name for column in table.columns]
    json_columns = {column.name for column in table.columns
                    if column.type.__class__.__name__ == "JSON"}
    cursor = connection.connection.driver_connection.cursor()  # type: ignore[union-attr]
    with cursor.copy(f'COPY {table.name} ({", ".join(columns)}) FROM STDIN') as copy:
        for row in rows:
            copy.write_row([Json(row[c]) if c in json_columns and row[c] is not None
                            else row[c] for c in columns])


def _advance_sequences(connection: Connection) -> None:
    """PostgreSQL's id sequences past the ids given explicitly (SQLite's rowid follows the
    largest id by itself)."""
    if is_sqlite(str(connection.engine.url)):
        return
    for table in TABLES:
        connection.execute(text(
            f"SELECT setval(pg_get_serial_sequence('{table.name}', 'id'), "
            f"(SELECT max(id) FROM {table.name}))"))

