"""Agent tokens bound to nodes (design §3.6): a bound token writes runs of its nodes only;
any other node is a 403 that names it, and nothing of the refused run is stored."""

from __future__ import annotations

from typing import Any

import pytest
from helpers.documents import run_document
from sqlalchemy import func, select

from numparity_server.auth import service
from numparity_server.kit.db import get_engine, session_factory
from numparity_server.kit.errors import BadRequest
from numparity_server.models import Node, Result, Run


def bound_token(api: Any, *, names: tuple[str, ...] = (), patterns: tuple[str, ...] = ()
                ) -> tuple[dict[str, str], str, int]:
    with session_factory(get_engine(api.settings))() as session:
        created = service.create_token(session=session, role="agent", label="bound",
                                       node_names=names, node_patterns=patterns)
    return {"Authorization": f"Bearer {created.token}"}, created.token, created.id


def upload(api: Any, headers: dict[str, str], node: str) -> Any:
    return api.client.post("/api/v1/runs", json=run_document(node), headers=headers)


def stored(api: Any) -> tuple[int, int, list[str]]:
    """Runs, results and node names in the database."""
    with session_factory(get_engine(api.settings))() as session:
        return (session.scalar(select(func.count()).select_from(Run)) or 0,
                session.scalar(select(func.count()).select_from(Result)) or 0,
                sorted(session.scalars(select(Node.name))))


def test_a_bound_token_writes_its_node_and_is_refused_for_another(api):
    headers, token, token_id = bound_token(api, names=("gpu-01",))
    assert upload(api, headers, "gpu-01").status_code == 201
    before = stored(api)

    refused = upload(api, headers, "victim")
    assert refused.status_code == 403
    body = refused.json()
    # Its own code, so an agent sets the run aside and goes on (issue 40).
    assert body["error"] == "node_forbidden"
    assert body["detail"] == (f"token {token_id} is bound to gpu-01: it may not write runs "
                              "of node 'victim'")
    assert token not in refused.text
    assert stored(api) == before and "victim" not in before[2]


def test_a_pattern_binds_the_names_it_matches_case_sensitively(api):
    headers, _, _ = bound_token(api, names=("login-1",), patterns=("gpu-*", "rack[12]-?"))
    for node in ("gpu-17", "gpu-", "rack2-a", "login-1"):
        assert upload(api, headers, node).status_code == 201, node
    for node in ("GPU-17", "cpu-gpu-1", "rack3-a", "rack1-ab", "login-10"):
        response = upload(api, headers, node)
        assert response.status_code == 403, node
        assert f"node {node!r}" in response.json()["detail"]
        assert "bound to login-1, pattern gpu-*, pattern rack[12]-?" in response.json()["detail"]
    assert stored(api)[2] == ["gpu-", "gpu-17", "login-1", "rack2-a"]


def test_a_refused_run_is_not_stored_even_when_its_run_id_is_new_or_known(api):
    headers, _, _ = bound_token(api, names=("gpu-01",))
    mine = run_document("gpu-01")
    assert api.client.post("/api/v1/runs", json=mine, headers=headers).status_code == 201
    # The same run_id under another node name: refused before it could be a 409 or a replay.
    forged = {**mine, "node": {"name": "victim", "labels": {}}}
    assert api.client.post("/api/v1/runs", json=forged, headers=headers).status_code == 403
    summary = api.client.get(f"/api/v1/runs/{mine['run_id']}", headers=api.reader).json()
    assert summary["node"] == "gpu-01"


def test_a_bound_token_cannot_slip_past_with_a_node_that_is_not_a_name(api):
    headers, _, _ = bound_token(api, names=("gpu-01",))
    for node in ({"name": ["victim"]}, {"name": None}, "victim", None):
        document = {**run_document("gpu-01"), "node": node}
        response = api.client.post("/api/v1/runs", json=document, headers=headers)
        assert response.status_code == 403, node
    assert stored(api) == (0, 0, [])


def test_an_unbound_agent_token_writes_any_node(api):
    for node in ("gpu-01", "victim", "anything-at-all"):
        assert api.post_run(run_document(node)).status_code == 201
    assert stored(api)[2] == ["anything-at-all", "gpu-01", "victim"]


def test_a_revoked_bound_token_is_401(api):
    headers, _, token_id = bound_token(api, names=("gpu-01",))
    with session_factory(get_engine(api.settings))() as session:
        service.revoke_token(session=session, token_id=token_id)
    response = upload(api, headers, "gpu-01")
    assert response.status_code == 401 and response.json()["detail"] == "token revoked"
    assert stored(api) == (0, 0, [])


def test_only_agent_tokens_are_bound_and_names_are_checked(api):
    with session_factory(get_engine(api.settings))() as session:
        for role in ("reader", "admin"):
            with pytest.raises(BadRequest, match=f"a {role} token cannot be"):
                service.create_token(session=session, role=role, node_names=["gpu-01"])
        with pytest.raises(BadRequest, match="a node pattern has 1 to 255 characters, not 0"):
            service.create_token(session=session, role="agent", node_patterns=[""])
        with pytest.raises(BadRequest, match="a node name has 1 to 255 characters, not 256"):
            service.create_token(session=session, role="agent", node_names=["n" * 256])
        created = service.create_token(session=session, role="agent",
                                       node_names=["a", "b", "a"])
        listed = {t.id: t for t in service.list_tokens(session=session)}
    assert listed[created.id].node_names == ["a", "b"]
    assert listed[created.id].node_patterns is None
    assert all(t.node_names is None for i, t in listed.items() if i != created.id)
