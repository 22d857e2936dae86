"""The database out of reach: 503 with Retry-After and ``database_unavailable``, never 500."""

from __future__ import annotations

import os

import psycopg
import pytest
from fastapi.testclient import TestClient
from helpers.documents import run_document

from numparity_server.app import create_app
from numparity_server.kit.settings import Settings

AUTH = {"Authorization": "Bearer np_some-token"}


def assert_unavailable(response) -> None:
    assert response.status_code == 503, response.text
    assert response.json()["error"] == "database_unavailable"
    assert "retry later" in response.json()["detail"]
    assert int(response.headers["retry-after"]) > 0


@pytest.mark.parametrize("url", [
    # Port 1 on loopback: nothing listens, the connection is refused at once.
    "postgresql+psycopg://postgres@127.0.0.1:1/numparity",
    "sqlite:////nonexistent-directory/numparity.db",
])
def test_unreachable_database_is_503_with_retry_after(url):
    with TestClient(create_app(Settings(database_url=url))) as client:
        assert client.get("/healthz").status_code == 200
        assert_unavailable(client.post("/api/v1/runs", json=run_document(), headers=AUTH))
        assert_unavailable(client.get("/api/v1/runs", headers=AUTH))
        assert_unavailable(client.get("/api/v1/nodes", headers=AUTH))
        assert_unavailable(client.post("/api/v1/fingerprints/missing",
                                       json={"hashes": ["a" * 64]}, headers=AUTH))
        assert client.get("/readyz").status_code == 503


def test_dropped_database_is_503_with_retry_after(make_api, migrated_database_url):
    if not migrated_database_url.startswith("postgresql"):
        pytest.skip("drops a PostgreSQL database under a running app")
    api = make_api()
    assert api.post_run(run_document()).status_code == 201
    assert api.client.get("/api/v1/runs", headers=api.reader).status_code == 200

    from sqlalchemy import make_url

    parsed = make_url(migrated_database_url)
    base = make_url(os.environ["NUMPARITY_TEST_DATABASE_URL"]).set(drivername="postgresql")
    with psycopg.connect(base.render_as_string(hide_password=False), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE "{parsed.database}" WITH (FORCE)')

    assert_unavailable(api.post_run(run_document()))
    assert_unavailable(api.client.get("/api/v1/runs", headers=api.reader))
    assert api.client.get("/readyz").status_code == 503
