"""Fixtures of the server tests: an app on a migrated database with tokens (``api``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from fastapi.testclient import TestClient

from numparity_server.app import create_app
from numparity_server.auth import service as auth_service
from numparity_server.kit.db import get_engine, session_factory
from numparity_server.kit.settings import Settings


@dataclass
class Api:
    client: TestClient
    settings: Settings
    agent: dict[str, str]
    reader: dict[str, str]
    admin: dict[str, str]

    def post_run(self, document: dict[str, Any], **kwargs: Any) -> Any:
        return self.client.post("/api/v1/runs", json=document, headers=self.agent, **kwargs)


def make_token(settings: Settings, role: str) -> str:
    with session_factory(get_engine(settings))() as session:
        return auth_service.create_token(session=session, role=role, label=f"test-{role}").token


@pytest.fixture
def make_api(migrated_database_url: str) -> Iterator[Callable[..., Api]]:
    clients: list[TestClient] = []

    def build(**overrides: Any) -> Api:
        settings = Settings(database_url=migrated_database_url, **overrides)
        client = TestClient(create_app(settings))
        client.__enter__()
        clients.append(client)
        headers = {role: {"Authorization": f"Bearer {make_token(settings, role)}"}
                   for role in ("agent", "reader", "admin")}
        return Api(client=client, settings=settings, **headers)

    yield build
    for client in clients:
        client.__exit__(None, None, None)


@pytest.fixture
def api(make_api: Callable[..., Api]) -> Api:
    return make_api()
