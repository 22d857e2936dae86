"""Security headers on every answer: API JSON, pages, static files, the OpenAPI pages,
redirects and errors (401, 403, 404, 405, 422, 503)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from helpers.documents import run_document

from numparity_server.app import create_app
from numparity_server.kit.settings import Settings


def directives(policy: str) -> dict[str, list[str]]:
    parsed = {}
    for part in policy.split(";"):
        if part.strip():
            name, *values = part.split()
            parsed[name] = values
    return parsed


def assert_secured(response, where):
    headers = response.headers
    assert headers.get("x-content-type-options") == "nosniff", where
    assert headers.get("x-frame-options") == "DENY", where
    assert headers.get("referrer-policy") == "same-origin", where
    policy = directives(headers.get("content-security-policy", ""))
    assert policy.get("frame-ancestors") == ["'none'"], (where, policy)
    assert policy.get("object-src") == ["'none'"], (where, policy)
    assert policy.get("base-uri") == ["'none'"], (where, policy)
    for directive in ("script-src", "style-src"):
        # Only this server's files (and, on the OpenAPI pages, hashes of their inline
        # code): no other host, no inline code in general, no eval.
        sources = policy.get(directive, policy.get("default-src"))
        assert sources and sources[0] == "'self'", (where, directive, policy)
        assert not {"'unsafe-eval'", "*", "https:", "http:", "data:"} & set(sources), (
            where, directive, policy)
        if directive == "script-src":
            assert "'unsafe-inline'" not in sources, (where, policy)
        assert all(source == "'self'" or source.startswith("'sha256-")
                   or source == "'unsafe-inline'" for source in sources), (where, policy)


@pytest.fixture
def fleet_api(api):
    assert api.post_run(run_document("node-1", run_id="r1")).status_code == 201
    return api


def test_every_kind_of_answer_carries_the_security_headers(fleet_api):
    api = fleet_api
    client = api.client
    answers = {
        "API JSON": client.get("/api/v1/nodes", headers=api.reader),
        "API CSV": client.get("/api/v1/audit?format=csv", headers=api.reader),
        "API 401": client.get("/api/v1/nodes"),
        "API 403": client.get("/api/v1/nodes", headers=api.agent),
        "API 404": client.get("/api/v1/nodes/ghost", headers=api.reader),
        "API 405": client.delete("/api/v1/nodes", headers=api.reader),
        "API 422": client.get("/api/v1/nodes?limit=abc", headers=api.reader),
        "API POST 201": api.post_run(run_document("node-2")),
        "page": client.get("/", headers=api.reader),
        "page redirect to sign-in": client.get("/", follow_redirects=False),
        "sign-in page": client.get("/login"),
        "sign-in 403": client.post("/login", data={"token": "x"},
                                   headers={"Origin": "http://evil.example"}),
        "page 404": client.get("/nodes/ghost", headers=api.reader),
        "no such page": client.get("/no/such/page", headers=api.reader),
        "page 422": client.get("/nodes/node-1?limit=abc", headers=api.reader),
        "CSV download": client.get("/audit.csv", headers=api.reader),
        "static": client.get("/static/dashboard.js"),
        "static 404": client.get("/static/nothing.js"),
        "vendored library": client.get("/static/vendor/uPlot.iife.min.js"),
        "OpenAPI schema": client.get("/openapi.json"),
        "Swagger UI": client.get("/docs"),
        "ReDoc": client.get("/redoc"),
        "healthz": client.get("/healthz"),
        "readyz": client.get("/readyz"),
        "metrics": client.get("/metrics", headers=api.reader),
    }
    expected = {"API 401": 401, "API 403": 403, "API 404": 404, "API 405": 405,
                "API 422": 422, "API POST 201": 201, "page redirect to sign-in": 303,
                "sign-in 403": 403, "page 404": 404, "no such page": 404, "page 422": 422,
                "static 404": 404}
    for where, response in answers.items():
        assert response.status_code == expected.get(where, 200), (where, response.text[:300])
        assert_secured(response, where)


def test_database_unavailable_answers_carry_them_too():
    url = "sqlite:////nonexistent-directory/numparity.db"
    with TestClient(create_app(Settings(database_url=url, open_reads=True))) as client:
        for path in ("/api/v1/nodes", "/", "/readyz"):
            response = client.get(path)
            assert response.status_code == 503, path
            assert_secured(response, path)


def test_a_route_may_set_a_policy_of_its_own(api):
    """The OpenAPI pages run code of their own: their policy is theirs, still strict."""
    docs = directives(api.client.get("/docs").headers["content-security-policy"])
    page = directives(api.client.get("/login").headers["content-security-policy"])
    assert page["script-src"] == ["'self'"] and page["style-src"] == ["'self'"]
    assert any(source.startswith("'sha256-") for source in docs["script-src"])
