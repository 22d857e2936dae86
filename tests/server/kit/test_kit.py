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
                      metrics_cache_seconds=2.5)
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
