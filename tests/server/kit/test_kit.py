"""Plumbing: engines, settings, OpenAPI."""

from __future__ import annotations

from sqlalchemy import text

from numparity_server.kit.db import create_engine_for, normalize_url
from numparity_server.kit.settings import Settings, worker_environment


def test_sqlite_runs_in_wal_with_a_busy_timeout(tmp_path):
    engine = create_engine_for(Settings(database_url=f"sqlite:///{tmp_path / 'x.db'}",
                                        sqlite_busy_timeout_ms=1234))
    try:
        with engine.connect() as connection:
            assert connection.execute(text("PRAGMA journal_mode")).scalar() == "wal"
            assert connection.execute(text("PRAGMA busy_timeout")).scalar() == 1234
            assert connection.execute(text("PRAGMA foreign_keys")).scalar() == 1
    finally:
        engine.dispose()


def test_postgresql_urls_use_psycopg():
    assert normalize_url("postgresql://u@h/db").drivername == "postgresql+psycopg"
    assert normalize_url("postgres://u@h/db").drivername == "postgresql+psycopg"


def test_settings_come_from_numparity_variables(monkeypatch):
    monkeypatch.setenv("NUMPARITY_DATABASE_URL", "sqlite:////tmp/elsewhere.db")
    monkeypatch.setenv("NUMPARITY_OPEN_READS", "true")
    monkeypatch.setenv("NUMPARITY_MAX_BODY_BYTES", "1024")
    settings = Settings()
    assert settings.database_url == "sqlite:////tmp/elsewhere.db"
    assert settings.open_reads is True and settings.max_body_bytes == 1024
    assert Settings.model_fields["max_body_bytes"].default == 32 * 1024 * 1024


def test_worker_processes_rebuild_the_parents_settings(monkeypatch, tmp_path):
    """`serve --workers N` hands its settings to uvicorn's workers through the environment:
    what a worker reads back is what the parent had, flags and file paths included."""
    parent = Settings(database_url="postgresql+psycopg://u@h/db", open_reads=True,
                      policy_file=tmp_path / "policy.toml", retention_days=30,
                      metrics_cache_seconds=2.5,
                      public_url="https://numparity.lab.example")
    for name in list(worker_environment(Settings())):
        monkeypatch.delenv(name, raising=False)
    for name, value in worker_environment(parent).items():
        monkeypatch.setenv(name, value)
    assert Settings() == parent


def test_openapi_documents_the_run_document(api):
    schema = api.client.get("/openapi.json").json()
    body = schema["paths"]["/api/v1/runs"]["post"]["requestBody"]
    assert body["content"]["application/json"]["schema"]["$ref"].endswith("/RunDocument")
    assert "TensorEntry" in schema["components"]["schemas"]
    assert api.client.get("/docs").status_code == 200


def test_the_sqlite_file_and_its_wal_and_shm_are_readable_by_the_owner_only(tmp_path):
    """Tokens' hashes and the fleet's data: a database the server creates is mode 0600,
    whatever the umask, and SQLite gives its -wal and -shm files the same mode."""
    import os
    import stat

    from numparity_server.kit import migrate

    database = tmp_path / "numparity.db"
    previous = os.umask(0o022)  # the usual umask: files come out 0644
    try:
        migrate.upgrade(f"sqlite:///{database}")
        engine = create_engine_for(Settings(database_url=f"sqlite:///{database}"))
        with engine.connect() as connection:
            connection.execute(text("CREATE TABLE probe (x INTEGER)"))
            connection.commit()
            modes = {path.name: stat.S_IMODE(path.stat().st_mode)
                     for path in tmp_path.iterdir()}
        engine.dispose()
    finally:
        os.umask(previous)
    assert modes == {"numparity.db": 0o600, "numparity.db-wal": 0o600,
                     "numparity.db-shm": 0o600}


def test_an_existing_sqlite_file_keeps_the_mode_its_owner_gave_it(tmp_path):
    import os
    import stat

    database = tmp_path / "numparity.db"
    database.touch()
    os.chmod(database, 0o640)  # e.g. readable by a backup group
    engine = create_engine_for(Settings(database_url=f"sqlite:///{database}"))
    with engine.connect() as connection:
        connection.execute(text("CREATE TABLE probe (x INTEGER)"))
        connection.commit()
    engine.dispose()
    assert stat.S_IMODE(database.stat().st_mode) == 0o640
