"""Tokens and roles: 401 without a valid token, 403 with the wrong role, open reads."""

from __future__ import annotations

import pytest
from helpers.documents import run_document

from numparity_server.auth import service
from numparity_server.kit.db import get_engine, session_factory
from numparity_server.kit.errors import BadRequest


def test_missing_token_is_401_naming_the_header(api):
    response = api.client.post("/api/v1/runs", json=run_document())
    assert response.status_code == 401
    body = response.json()
    assert body["error"] == "unauthorized" and "Authorization" in body["detail"]
    assert response.headers["www-authenticate"] == "Bearer"


def test_unknown_token_is_401(api):
    response = api.client.post("/api/v1/runs", json=run_document(),
                               headers={"Authorization": "Bearer np_not-a-token"})
    assert response.status_code == 401 and response.json()["detail"] == "unknown token"



def test_reader_cannot_post_runs(api):
    response = api.client.post("/api/v1/runs", json=run_document(), headers=api.reader)
    assert response.status_code == 403
    assert "agent" in response.json()["detail"]


def test_agent_cannot_read_and_admin_can_do_both(api):
    document = run_document()
    assert api.client.post("/api/v1/runs", json=document, headers=api.admin).status_code == 201
    path = f"/api/v1/runs/{document['run_id']}"
    assert api.client.get(path, headers=api.agent).status_code == 403
    assert api.client.get(path, headers=api.admin).status_code == 200
    assert api.client.get(path, headers=api.reader).status_code == 200


def test_open_reads_opens_reads_only(make_api):
    api = make_api(open_reads=True)
    document = run_document()
    assert api.client.post("/api/v1/runs", json=document).status_code == 401
    assert api.post_run(document).status_code == 201
    assert api.client.get(f"/api/v1/runs/{document['run_id']}").status_code == 200


def test_tokens_are_stored_hashed(api):
    with session_factory(get_engine(api.settings))() as session:
        created = service.create_token(session=session, role="reader", label="grafana")
        listed = service.list_tokens(session=session)
        from numparity_server.models import Token

        row = session.get(Token, created.id)
    assert row.sha256 == service.hash_token(created.token) and created.token not in row.sha256
    assert [t.label for t in listed][-1] == "grafana"
    assert not hasattr(listed[-1], "token")


def test_a_check_token_reads_the_check_plan_and_writes_nothing(api):
    """Issue 39, finding 5: a job's preflight holds a token that only reads check's plan."""
    document = run_document()
    assert api.post_run(document).status_code == 201
    with session_factory(get_engine(api.settings))() as session:
        token = service.create_token(session=session, role="check", label="jobs").token
    check = {"Authorization": f"Bearer {token}"}
    plan = api.client.get("/api/v1/agent/check", headers=check, params={
        "env_key": document["environment"]["env_key"], "model": "cpu"})
    assert plan.status_code == 200, plan.text
    assert plan.json()["environment_known"] is True
    # An agent's token may check as before.
    assert api.client.get("/api/v1/agent/check", headers=api.agent, params={
        "env_key": "e" * 64, "model": "cpu"}).status_code == 200
    other = run_document()
    refused = api.client.post("/api/v1/runs", json=other, headers=check)
    assert refused.status_code == 403 and "agent role" in refused.json()["detail"]
    assert api.client.get(f"/api/v1/runs/{other['run_id']}", headers=api.reader
                          ).status_code == 404
    assert api.client.post("/api/v1/fingerprints/missing", json={"hashes": []},
                           headers=check).status_code == 403
    assert api.client.get(f"/api/v1/runs/{document['run_id']}", headers=check
                          ).status_code == 403
    assert api.client.post("/api/v1/goldens", json={"source": "majority", "node": "x",
                                                    "reason": "r"},
                           headers=check).status_code == 403
    with session_factory(get_engine(api.settings))() as session:
        with pytest.raises(BadRequest, match="only agent tokens are bound"):
            service.create_token(session=session, role="check", node_names=["n"])
