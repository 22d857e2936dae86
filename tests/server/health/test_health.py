"""/healthz and /readyz."""

from __future__ import annotations

from fastapi.testclient import TestClient

from numparity_server.app import create_app
from numparity_server.kit.settings import Settings


def test_ready_on_a_migrated_database(api):
    assert api.client.get("/healthz").json() == {"status": "ok"}
    ready = api.client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["status"] == "ok"


def test_not_ready_before_migration(database_url):
    with TestClient(create_app(Settings(database_url=database_url))) as client:
        response = client.get("/readyz")
    assert response.status_code == 503
    assert "numparity-server migrate" in response.json()["detail"]


def test_migrate_on_start(database_url):
    settings = Settings(database_url=database_url, migrate_on_start=True)
    with TestClient(create_app(settings)) as client:
        assert client.get("/readyz").status_code == 200


def test_not_ready_when_the_database_is_unreachable():
    # Port 9 (discard) on loopback: nothing listens, the connection is refused at once.
    settings = Settings(database_url="postgresql+psycopg://postgres@127.0.0.1:9/none")
    with TestClient(create_app(settings)) as client:
        assert client.get("/healthz").status_code == 200
        response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["error"] == "unavailable"
    assert "unreachable" in response.json()["detail"]
