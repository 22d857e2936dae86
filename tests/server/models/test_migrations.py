"""Alembic: an empty database upgrades to head and back, and models match migrations."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, Engine, inspect, text

from numparity_server.kit import migrate
from numparity_server.kit.db import create_engine_for
from numparity_server.kit.settings import Settings
from numparity_server.models import Base

TABLES = {"nodes", "environments", "runs", "results", "manifests", "fingerprints", "latest",
          "tokens", "devices", "traces", "explanations", "comparisons"}
NOW = "2026-11-21 10:00:00+00:00"  # a fixed timestamp for rows written by raw SQL


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    """An engine on the test database, one connection per use (as the CLI migrates)."""
    engine = create_engine_for(Settings(database_url=database_url), pooled=False)
    yield engine
    engine.dispose()


def insert_one_result(connection: Connection) -> None:
    """Node 1 on environment 7 ran run 3, whose result 11 says outcome 5 (a strict cnn):
    rows as every revision before 0006 holds them."""
    for statement in (
        "INSERT INTO nodes (id, name, labels, first_seen, last_seen) "
        f"VALUES (1, 'n', '{{}}', '{NOW}', '{NOW}')",
        "INSERT INTO environments (id, env_key, document, first_seen) "
        f"VALUES (7, 'e', '{{}}', '{NOW}')",
        "INSERT INTO runs (id, run_id, node_id, environment_id, started_at, "
        f"document_sha256, drill, received_at) VALUES (3, 'r', 1, 7, '{NOW}', 'x', "
        f"false, '{NOW}')",
        "INSERT INTO outcomes (id, hash, suite, workload, variant, device, status) "
        "VALUES (5, 'h', 'standard', 'cnn', 'strict', 'cpu', 'ok')",
        "INSERT INTO results (id, run_id, outcome_id, wall_s) VALUES (11, 3, 5, 0.25)",
    ):
        connection.execute(text(statement))


def test_upgrade_to_head_and_back_down(database_url, engine):
    migrate.upgrade(database_url)
    with engine.connect() as connection:
        assert migrate.current_revision(connection) == migrate.head_revision()
        assert TABLES <= set(inspect(connection).get_table_names())
    migrate.downgrade(database_url, "base")
    with engine.connect() as connection:
        assert migrate.current_revision(connection) is None
        assert not TABLES & set(inspect(connection).get_table_names())
    migrate.upgrade(database_url)  # and up again, from a downgraded database


def test_models_and_migrations_describe_the_same_schema(migrated_database_url, engine):
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        assert compare_metadata(context, Base.metadata) == []


def test_every_lookup_column_is_indexed(migrated_database_url, engine):
    inspector = inspect(engine)

    def indexed(table: str) -> set[tuple[str, ...]]:
        found = {tuple(ix["column_names"]) for ix in inspector.get_indexes(table)}
        found |= {tuple(uq["column_names"]) for uq in inspector.get_unique_constraints(table)}
        return found

    assert ("suite", "workload", "variant") in indexed("outcomes")
    assert ("hash",) in indexed("outcomes")
    assert ("run_pk",) in indexed("results") and ("outcome_id",) in indexed("results")
    assert ("suite", "workload", "variant") in indexed("latest")
    assert ("node_id", "device_id", "suite", "workload", "variant") in indexed("latest")
    assert ("device_id",) in indexed("results")
    assert ("identity",) in indexed("devices") and ("uuid",) in indexed("devices")
    assert ("node_id",) in indexed("devices")
    assert ("manifest_hash",) in indexed("outcomes")
    assert ("trace_hash",) in indexed("outcomes")
    assert ("run_id",) in indexed("runs") and ("env_key",) in indexed("environments")
    assert ("sha256",) in indexed("tokens")
    assert ("suite", "workload", "variant") in indexed("explanations")
    assert ("against_run_pk",) in indexed("explanations")
    assert ("node_id",) in indexed("explanations")
    assert ("against_node_id",) in indexed("explanations")


def test_0002_fills_latest_from_the_results_it_points_at(database_url, engine):
    """A database with runs at 0001 keeps its answers: latest's new copies are filled."""
    migrate.upgrade(database_url, "0001")
    with engine.begin() as connection:
        insert_one_result(connection)
        connection.execute(text(  # latest at 0001: only the result it points at
            "INSERT INTO latest (id, node_id, suite, workload, variant, result_id, "
            f"started_at) VALUES (1, 1, 'standard', 'cnn', 'strict', 11, '{NOW}')"))
    migrate.upgrade(database_url)
    with engine.connect() as connection:
        row = connection.execute(
            text("SELECT outcome_id, environment_id, wall_s FROM latest")).one()
    assert tuple(row) == (5, 7, 0.25)
    migrate.downgrade(database_url, "0001")
    with engine.connect() as connection:
        columns = {c["name"] for c in inspect(connection).get_columns("latest")}
    assert "outcome_id" not in columns and "result_id" in columns


def test_0004_gives_nodes_their_newest_environment_and_marks_changes(database_url, engine):
    migrate.upgrade(database_url, "0003")
    with engine.begin() as connection:
        for statement in (
            "INSERT INTO nodes (id, name, labels, first_seen, last_seen) VALUES "
            "(1, 'moved', '{}', '2026-11-20 00:00:00+00:00', '2026-11-20 00:00:00+00:00'),"
            "(2, 'stayed', '{}', '2026-11-20 00:00:00+00:00', '2026-11-20 00:00:00+00:00')",
            "INSERT INTO environments (id, env_key, document, first_seen) VALUES "
            "(7, 'e7', '{}', '2026-11-20 00:00:00+00:00'),"
            "(8, 'e8', '{}', '2026-11-20 00:00:00+00:00')",
            "INSERT INTO runs (id, run_id, node_id, environment_id, started_at, "
            "document_sha256, drill, received_at) VALUES "
            "(1, 'm1', 1, 7, '2026-11-20 01:00:00+00:00', 'x', false, "
            "'2026-11-20 01:00:00+00:00'),"
            "(2, 'm2', 1, 8, '2026-11-20 02:00:00+00:00', 'x', false, "
            "'2026-11-20 02:00:00+00:00'),"
            "(3, 's1', 2, 7, '2026-11-20 01:00:00+00:00', 'x', false, "
            "'2026-11-20 01:00:00+00:00')",
        ):
            connection.execute(text(statement))
    migrate.upgrade(database_url)
    with engine.connect() as connection:
        rows = {name: (env, changed is not None) for name, env, changed in connection.execute(
            text("SELECT name, environment_id, environment_changed_at FROM nodes"))}
    assert rows == {"moved": (8, True), "stayed": (7, False)}
    migrate.downgrade(database_url, "0003")


def test_0006_renames_results_run_id_to_run_pk_keeping_every_result(database_url, engine):
    """The rename keeps the values, and the foreign key still drops a run's results with
    it (on SQLite the table is copied to rename the constraint)."""
    migrate.upgrade(database_url, "0005")
    with engine.begin() as connection:
        insert_one_result(connection)
    migrate.upgrade(database_url, "0006")
    with engine.connect() as connection:
        assert connection.execute(text("SELECT id, run_pk FROM results")).all() == [(11, 3)]
    migrate.downgrade(database_url, "0005")
    with engine.connect() as connection:
        assert connection.execute(text("SELECT id, run_id FROM results")).all() == [(11, 3)]
    migrate.upgrade(database_url, "0006")
    with engine.begin() as connection:
        connection.execute(text("DELETE FROM runs WHERE id = 3"))
        assert connection.execute(text("SELECT count(*) FROM results")).scalar() == 0


def test_0007_binds_tokens_to_nodes_and_its_downgrade_revokes_the_bound(database_url, engine):
    """Tokens of 0006 stay unbound; a downgrade cannot keep a binding, so it revokes the
    live bound tokens rather than let them write runs of any node."""
    migrate.upgrade(database_url, "0006")
    with engine.begin() as connection:
        connection.execute(text(
            "INSERT INTO tokens (id, sha256, role, label, created_at) VALUES "
            f"(1, 'a', 'agent', 'fleet', '{NOW}'), (2, 'r', 'reader', 'grafana', '{NOW}')"))
    migrate.upgrade(database_url, "0007")
    with engine.begin() as connection:
        assert connection.execute(text(
            "SELECT id, node_names, node_patterns FROM tokens ORDER BY id")).all() == [
            (1, None, None), (2, None, None)]
        connection.execute(text(
            "INSERT INTO tokens (id, sha256, role, label, created_at, node_names, "
            f"node_patterns) VALUES (3, 'b', 'agent', 'gpu-01', '{NOW}', '[\"gpu-01\"]', "
            f"NULL), (4, 'p', 'agent', 'gpus', '{NOW}', NULL, '[\"gpu-*\"]')"))
    with engine.connect() as connection:
        rows = connection.execute(text("SELECT node_names, node_patterns FROM tokens "
                                       "WHERE id IN (3, 4) ORDER BY id")).all()
    # Raw SQL: SQLite gives the JSON text, PostgreSQL the parsed value.
    assert [tuple(json.loads(v) if isinstance(v, str) else v for v in row) for row in rows] == [
        (["gpu-01"], None), (None, ["gpu-*"])]
    migrate.downgrade(database_url, "0006")
    with engine.connect() as connection:
        revoked = dict(connection.execute(
            text("SELECT id, revoked_at IS NOT NULL FROM tokens ORDER BY id")).all())
        columns = {c["name"] for c in inspect(connection).get_columns("tokens")}
    assert revoked == {1: False, 2: False, 3: True, 4: True}
    assert not {"node_names", "node_patterns"} & columns
    migrate.upgrade(database_url, "0007")


def test_0008_gives_stored_runs_devices_by_their_node_and_slot(database_url, engine):
    """Runs stored before devices existed keep their answers: each (node, device string)
    becomes a device of that node, and every result and latest row points at it; the
    downgrade keeps one latest row per (node, key) again."""
    migrate.upgrade(database_url, "0005")
    with engine.begin() as connection:
        insert_one_result(connection)
    migrate.upgrade(database_url, "0007")
    with engine.begin() as connection:
        for statement in (
            "INSERT INTO outcomes (id, hash, suite, workload, variant, device, status) "
            "VALUES (6, 'g', 'standard', 'mlp', 'strict', 'cuda:1', 'ok')",
            "INSERT INTO results (id, run_pk, outcome_id, wall_s) VALUES (12, 3, 6, 0.5)",
            "INSERT INTO latest (id, node_id, suite, workload, variant, result_id, started_at,"
            f" outcome_id, environment_id, wall_s) VALUES (1, 1, 'standard', 'cnn', 'strict',"
            f" 11, '{NOW}', 5, 7, 0.25)",
        ):
            connection.execute(text(statement))
    migrate.upgrade(database_url)
    with engine.connect() as connection:
        devices = {row.identity: (row.id, row.type, row.model, row.node_id, row.slot)
                   for row in connection.execute(text(
                       "SELECT id, identity, type, model, node_id, slot FROM devices"))}
        results = dict(connection.execute(text("SELECT id, device_id FROM results")).all())
        latest = connection.execute(text("SELECT device_id FROM latest")).scalar_one()
    assert {identity: rest for identity, (_, *rest) in devices.items()} == {
        "node:1/cpu": ["cpu", "cpu", 1, "cpu"], "node:1/cuda:1": ["cuda", "cuda", 1, "cuda:1"]}
    assert results == {11: devices["node:1/cpu"][0], 12: devices["node:1/cuda:1"][0]}
    assert latest == devices["node:1/cpu"][0]
    migrate.downgrade(database_url, "0007")
    with engine.connect() as connection:
        assert "devices" not in inspect(connection).get_table_names()
        assert connection.execute(text("SELECT result_id FROM latest")).scalar_one() == 11


def test_0009_keeps_stored_outcomes_without_a_trace_and_guards_the_reference(
        database_url, engine):
    """Outcomes stored before traces keep their rows with no trace; a trace an outcome
    refers to must exist (the foreign key retention and ingest rely on); the downgrade
    drops the traces and keeps the outcomes."""
    migrate.upgrade(database_url, "0008")
    with engine.begin() as connection:
        connection.execute(text(
            "INSERT INTO outcomes (id, hash, suite, workload, variant, device, status) "
            "VALUES (5, 'h', 'standard', 'cnn', 'strict', 'cpu', 'ok')"))
    migrate.upgrade(database_url)
    with engine.begin() as connection:
        assert connection.execute(text("SELECT hash, trace_hash FROM outcomes")).all() == [
            ("h", None)]
        connection.execute(text(
            "INSERT INTO traces (hash, body, op_count, created_at) "
            f"VALUES ('{'t' * 64}', :body, 2, '{NOW}')"), {"body": b"x"})
        connection.execute(text(f"UPDATE outcomes SET trace_hash = '{'t' * 64}'"))
    with pytest.raises(Exception, match="(?i)foreign key"), engine.begin() as connection:
        if connection.dialect.name == "sqlite":
            connection.execute(text("PRAGMA foreign_keys = ON"))
        connection.execute(text(
            "INSERT INTO outcomes (id, hash, suite, workload, variant, device, status, "
            f"trace_hash) VALUES (6, 'g', 'standard', 'cnn', 'default', 'cpu', 'ok', "
            f"'{'u' * 64}')"))
    migrate.downgrade(database_url, "0008")
    with engine.connect() as connection:
        assert "traces" not in inspect(connection).get_table_names()
        assert connection.execute(text("SELECT id, hash FROM outcomes")).all() == [(5, "h")]


def test_0010_explanations_go_with_their_reference_run(database_url, engine):
    """A finding points at its reference run, and goes when the run goes (retention);
    the downgrade drops the findings and keeps every run."""
    migrate.upgrade(database_url, "0009")
    with engine.begin() as connection:
        for statement in (
            "INSERT INTO nodes (id, name, labels, first_seen, last_seen) "
            f"VALUES (1, 'n', '{{}}', '{NOW}', '{NOW}'), (2, 'm', '{{}}', '{NOW}', '{NOW}')",
            "INSERT INTO environments (id, env_key, document, first_seen) "
            f"VALUES (7, 'e', '{{}}', '{NOW}')",
            "INSERT INTO runs (id, run_id, node_id, environment_id, started_at, "
            f"document_sha256, drill, received_at) VALUES (3, 'r', 1, 7, '{NOW}', 'x', "
            f"false, '{NOW}'), (4, 's', 1, 7, '{NOW}', 'y', false, '{NOW}')",
        ):
            connection.execute(text(statement))
    migrate.upgrade(database_url, "0010")
    with engine.begin() as connection:
        if connection.dialect.name == "sqlite":
            connection.execute(text("PRAGMA foreign_keys = ON"))
        connection.execute(text(
            "INSERT INTO explanations (id, node_id, environment_id, against_run_pk, "
            "against_node_id, suite, workload, variant, device, local_device, status, "
            "label, setting, tried, seconds, created_at) VALUES "
            f"(1, 2, 7, 3, 1, 'standard', 'mlp', 'default', 'cpu', 'cpu', 'reproduced', "
            f"'MKL_CBWR=COMPATIBLE', '{{\"env\": {{\"MKL_CBWR\": \"COMPATIBLE\"}}, "
            f"\"knobs\": {{}}}}', 1, 4.5, '{NOW}'), "
            f"(2, 2, 7, 4, 1, 'standard', 'mlp', 'default', 'cpu', 'cpu', 'already', "
            f"NULL, NULL, 0, 2.0, '{NOW}')"))
        connection.execute(text("DELETE FROM runs WHERE id = 3"))
        assert connection.execute(text("SELECT id FROM explanations")).all() == [(2,)]
    migrate.downgrade(database_url, "0009")
    with engine.connect() as connection:
        assert "explanations" not in inspect(connection).get_table_names()
        assert connection.execute(text("SELECT id FROM runs")).all() == [(4,)]


def test_0022_stored_findings_are_against_a_run_and_eager_ones_go_on_downgrade(
        database_url, engine):
    """Findings stored before 0022 read as target "run"; a result gains an empty compile
    record. The downgrade drops the eager findings (they would read as findings against
    the run's compiled bits) and keeps the others and every result."""
    migrate.upgrade(database_url, "0021")
    finding = ("INSERT INTO explanations (id, node_id, environment_id, against_run_pk, "
               "against_node_id, suite, workload, variant, device, local_device, status, "
               "label, setting, tried, seconds, created_at{target}) VALUES "
               "({id}, 1, 7, 3, 1, 'standard', 'mlp', 'compiled', 'cpu', 'cpu', "
               f"'not_reproduced', NULL, NULL, 5, 9.5, '{NOW}'{{value}})")
    with engine.begin() as connection:
        for statement in (
            "INSERT INTO nodes (id, name, labels, first_seen, last_seen) "
            f"VALUES (1, 'n', '{{}}', '{NOW}', '{NOW}')",
            "INSERT INTO environments (id, env_key, document, first_seen) "
            f"VALUES (7, 'e', '{{}}', '{NOW}')",
            "INSERT INTO runs (id, run_id, node_id, environment_id, started_at, "
            f"document_sha256, drill, received_at) VALUES (3, 'r', 1, 7, '{NOW}', 'x', "
            f"false, '{NOW}')",
            "INSERT INTO outcomes (id, hash, suite, workload, variant, device, status) "
            "VALUES (5, 'h', 'standard', 'mlp', 'compiled', 'cpu', 'ok')",
            "INSERT INTO results (id, run_pk, outcome_id, wall_s) VALUES (11, 3, 5, 0.25)",
            finding.format(target="", id=1, value=""),
        ):
            connection.execute(text(statement))
    migrate.upgrade(database_url, "0022")
    with engine.begin() as connection:
        assert connection.execute(text("SELECT id, target FROM explanations")).all() == [
            (1, "run")]
        assert connection.execute(text("SELECT compiled FROM results")).all() == [(None,)]
        connection.execute(text(finding.format(target=", target", id=2, value=", 'eager'")))
    migrate.downgrade(database_url, "0021")
    with engine.connect() as connection:
        assert connection.execute(text("SELECT id FROM explanations")).all() == [(1,)]
        assert connection.execute(text("SELECT id FROM results")).all() == [(11,)]
        columns = {c["name"] for c in inspect(connection).get_columns("results")}
        assert "compiled" not in columns
