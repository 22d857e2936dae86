"""No query or path value answers 500: every route of the app, found by walking its
routes, gets a NUL (``%00``) in each path and query value, an offset past int64, a huge
integer and a very long string in each query parameter, on SQLite and PostgreSQL."""

from __future__ import annotations

import re
from typing import Any

import fastapi.routing
import pytest
from fastapi.testclient import TestClient
from helpers.documents import run_document
from starlette.routing import Mount

from numparity_server.app import create_app
from numparity_server.kit.settings import Settings

# Values that name things that exist, so a request gets as far into the database as it can.
KNOWN = {"name": "node-1", "run_id": "r1", "run_a": "r1", "run_b": "r2", "workload": "cnn",
         "variant": "default", "node": "node-1", "env_key": "x", "table": "findings",
         "format": "json", "suite": "standard", "tensor": "output", "next": "/",
         "sha256": "0" * 64, "hash": "0" * 64, "golden_id": "1", "model": "cpu"}
HUGE = str(2**64)
LONG = "x" * 10_000


def routes() -> list[tuple[str, str, Any]]:
    """(method, path, route) of every route the app answers (mounts aside)."""
    app = create_app(Settings(database_url="sqlite://"))
    # FastAPI >= 0.160 keeps included routers as such; iter_route_contexts flattens them.
    walk = getattr(fastapi.routing, "iter_route_contexts", lambda routes: routes)
    found = []
    for route in walk(app.routes):
        if isinstance(getattr(route, "original_route", route), Mount):
            continue
        for method in sorted(set(route.methods or ()) - {"HEAD"}):
            found.append((method, route.path, route))
    return found


ROUTES = routes()


def query_names(route: Any) -> list[str]:
    """The query parameters of a route and of its dependencies (pagination)."""
    names: list[str] = []

    def walk(dependant: Any) -> None:
        names.extend(param.alias for param in dependant.query_params if param.alias not in names)
        for sub in dependant.dependencies:
            walk(sub)

    dependant = getattr(route, "dependant", None)
    if dependant is not None:  # /openapi.json, /docs: Starlette routes, no parameters
        walk(dependant)
    return names


def path_names(path: str) -> list[str]:
    return re.findall(r"{(\w+)(?::\w+)?}", path)


def fill(path: str, **values: str) -> str:
    return re.sub(r"{(\w+)(?::\w+)?}", lambda m: values.get(m.group(1), KNOWN[m.group(1)]),
                  path)


def request(api: Any, method: str, url: str, **params: str) -> Any:
    query = {name: KNOWN.get(name, "1") for name in params.pop("_names", [])}
    query.update(params)
    if method == "POST":
        return api.client.post(url, params=query, headers=api.admin, data={"token": ""})
    return api.client.request(method, url, params=query, headers=api.admin)


@pytest.fixture
def fleet_api(api):
    for node, run_id in (("node-1", "r1"), ("node-2", "r2")):
        assert api.post_run(run_document(node, run_id=run_id)).status_code == 201
    # A 500 is an answer to count here, not an exception to stop at.
    api.client = TestClient(api.client.app, raise_server_exceptions=False)
    return api


def test_every_route_is_found():
    paths = {path for _method, path, _route in ROUTES}
    assert {"/api/v1/runs", "/api/v1/nodes/{name}", "/api/v1/compare", "/", "/nodes/{name}",
            "/workloads/{workload}", "/compare", "/audit.csv", "/login"} <= paths
    assert sum(bool(query_names(route)) for _m, _p, route in ROUTES) >= 12


def test_a_nul_in_a_path_value_is_404_naming_the_parameter(fleet_api):
    failures = []
    for method, path, _route in ROUTES:
        for name in path_names(path):
            response = request(fleet_api, method, fill(path, **{name: "a%00b"}))
            if response.status_code != 404 or "NUL" not in response.text:
                failures.append((method, path, name, response.status_code,
                                 response.text[:200]))
    assert not failures, failures


def test_a_nul_in_a_query_value_is_422_naming_the_parameter(fleet_api):
    failures = []
    for method, path, route in ROUTES:
        names = query_names(route)
        for name in names:
            response = request(fleet_api, method, fill(path), _names=names, **{name: "a\x00b"})
            detail = response.json().get("detail") if response.headers.get(
                "content-type", "").startswith("application/json") else response.text
            if response.status_code != 422 or name not in str(detail) or "NUL" not in str(
                    detail):
                failures.append((method, path, name, response.status_code,
                                 response.text[:200]))
    assert not failures, failures


def test_an_offset_past_int64_is_422_naming_it_on_every_paginated_route(fleet_api):
    paginated = [(method, path, route) for method, path, route in ROUTES
                 if "offset" in query_names(route)]
    assert len(paginated) >= 6, paginated
    failures = []
    for method, path, route in paginated:
        for offset in (str(2**63), HUGE, str(10**30)):
            response = request(fleet_api, method, fill(path), _names=query_names(route),
                               offset=offset)
            if response.status_code != 422 or "offset" not in response.text:
                failures.append((method, path, offset, response.status_code,
                                 response.text[:200]))
    assert not failures, failures


@pytest.mark.parametrize("value", [HUGE, "-" + HUGE, LONG], ids=["huge", "negative", "long"])
def test_huge_integers_and_long_strings_in_any_query_value_are_never_a_500(fleet_api, value):
    failures = []
    for method, path, route in ROUTES:
        names = query_names(route)
        for name in names:
            response = request(fleet_api, method, fill(path), _names=names, **{name: value})
            if response.status_code >= 500:
                failures.append((method, path, name, response.status_code,
                                 response.text[:200]))
        for name in path_names(path):
            response = request(fleet_api, method, fill(path, **{name: value}), _names=names)
            if response.status_code >= 500:
                failures.append((method, path, name, response.status_code,
                                 response.text[:200]))
    assert not failures, failures
