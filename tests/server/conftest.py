"""Fixtures of the server tests: an app on a migrated database with tokens (``api``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from fastapi.testclient import TestClient
from helpers.documents import audit_document

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


@pytest.fixture
def fleet(make_api: Callable[..., Api], tmp_path: Any) -> Api:
    """A hand-made fleet with one of every audit finding (policy: MKL_CBWR must be unset)."""
    policy = tmp_path / "policy.toml"
    policy.write_text('window_days = 7\n[allowed]\n"env_vars.MKL_CBWR" = ["unset"]\n')
    api = make_api(policy_file=policy)
    mkl = {"MKL_CBWR": "COMPATIBLE"}
    documents = [
        *(audit_document(f"peer-{i}", 2) for i in (1, 2, 3)),
        # A corrupting node, drilled twice: suspect, marked as a drill.
        audit_document("drilled", 3, shift=1e-3, drill=True),
        audit_document("drilled", 2, shift=1e-3, drill=True),
        # Disagreed once, then agreed again: watch; its strict answer changed.
        audit_document("glitchy", 3, shift=1e-3),
        audit_document("glitchy", 2),
        # Repeats that disagree.
        audit_document("flaky", 2, env_vars=mkl, repeats_agree=False),
        # An upgrade that changed the numbers: drift naming the attribute.
        audit_document("upgraded", 5),
        audit_document("upgraded", 2, env_vars=mkl, shift=2e-3),
        # Different input bytes: broken inputs.
        audit_document("broken", 2, input_hash="in-" + "1" * 61),
        # Older than the window: its disagreement no longer counts.
        audit_document("old", 24 * 10, shift=1e-3),
        audit_document("old", 2),
    ]
    for document in documents:
        assert api.post_run(document).status_code == 201
    return api
