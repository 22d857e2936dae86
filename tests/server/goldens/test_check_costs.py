"""What one node's uploads and one token's questions cost `check`'s plan (design §3.11,
issue 39 finding 7): one node cannot reorder which decided keys are checked first, a
plan reads the manifests of the answers it sends and no others, the agent's budget is
not part of what is kept, and a plan computed for a token is paid from its byte budget.

Nodes upload with their own node-bound agent tokens through the app; on SQLite and
PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest
from helpers.documents import at, run_document

from numparity_server.auth import service as auth_service
from numparity_server.goldens import check as plans
from numparity_server.kit.db import get_engine, session_factory

CHECK = "/api/v1/agent/check"
# Cheapest first by the fleet's wall times: alpha, then beta … (the honest order).
WALLS = {"alpha": 0.2, "beta": 0.4, "gamma": 0.6, "delta": 0.8, "epsilon": 1.0,
         "zeta": 1.2, "eta": 1.4, "theta": 1.6}


def _document(node: str, workloads: tuple[str, ...], *, shift: float = 0.0,
              env_vars: dict[str, str] | None = None) -> dict[str, Any]:
    document = run_document(node, started_at=at(1), shift=shift, variants=("strict",),
                            workloads=workloads, env_vars=env_vars)
    for result in document["results"]:
        if result["status"] == "ok":
            result["wall_s"] = WALLS[result["workload"]]
            # A manifest of its own per workload (the same bytes under another name).
            result["tensors"][-1]["name"] += "-" + result["workload"]
    return document


def _tokens(api: Any, nodes: list[str]) -> dict[str, dict[str, str]]:
    """node → headers with an agent token bound to that node alone."""
    with session_factory(get_engine(api.settings))() as session:
        return {node: {"Authorization": "Bearer " + auth_service.create_token(
            session=session, role="agent", label=node, node_names=[node]).token}
            for node in nodes}


def _upload(api: Any, headers: dict[str, str], document: dict[str, Any]) -> None:
    response = api.client.post("/api/v1/runs", json=document, headers=headers)
    assert response.status_code == 201, response.text


def _order(api: Any, env_key: str, headers: dict[str, str], **params: Any) -> list[str]:
    plan = api.client.get(CHECK, params={"env_key": env_key, "model": "cpu", **params},
                          headers=headers)
    assert plan.status_code == 200, plan.text
    (device,) = plan.json()["devices"]
    return [check["workload"] for check in device["checks"]]


def _env_key(api: Any, node: str) -> str:
    nodes = api.client.get("/api/v1/nodes", headers=api.reader).json()["items"]
    return next(n["env_key"] for n in nodes if n["name"] == node)


def test_one_node_cannot_reorder_the_decided_keys_a_check_compares_first(make_api):
    api = make_api(check_cache_seconds=0)
    honest = ["honest-1", "honest-2", "honest-3"]
    tokens = _tokens(api, [*honest, "evil", "other-1", "other-2"])
    for node in honest:
        _upload(api, tokens[node], _document(node, ("alpha", "beta")))
    key = _env_key(api, "honest-1")
    assert _order(api, key, tokens["honest-1"]) == ["alpha", "beta"]  # the cheaper first

    # One node, its own token, another answer of beta in another environment: beta has
    # "more than one answer in the fleet", held by that node alone.
    _upload(api, tokens["evil"], _document("evil", ("beta",), shift=1e-3,
                                           env_vars={"EVIL": "1"}))
    assert _order(api, key, tokens["honest-1"]) == ["alpha", "beta"]

    # Two nodes holding another answer of beta: the fleet is split there, beta first.
    for node in ("other-1", "other-2"):
        _upload(api, tokens[node], _document(node, ("beta",), shift=2e-3,
                                             env_vars={"OTHER": "1"}))
    assert _order(api, key, tokens["honest-1"]) == ["beta", "alpha"]


@pytest.fixture
def decided(make_api: Any) -> tuple[Any, str, dict[str, dict[str, str]]]:
    """Three nodes deciding eight strict keys; the plan sends at most six of them."""
    api = make_api(check_cache_seconds=0)
    nodes = ["honest-1", "honest-2", "honest-3"]
    tokens = _tokens(api, nodes)
    for node in nodes:
        _upload(api, tokens[node], _document(node, tuple(WALLS)))
    return api, _env_key(api, "honest-1"), tokens


def test_a_plan_reads_the_manifests_it_sends_and_its_budget_is_not_a_new_question(
        decided: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    api, key, tokens = decided
    read: list[set[str]] = []
    original = plans.manifest_entries

    def spy(session: Any, hashes: Any) -> Any:
        read.append(set(hashes))
        return original(session, hashes)

    monkeypatch.setattr(plans, "manifest_entries", spy)
    computed = 0  # the fleet's answers read: once a question the server ranks
    node_answers = plans.repository.node_answers

    def count(*args: Any, **kwargs: Any) -> Any:
        nonlocal computed
        computed += 1
        return node_answers(*args, **kwargs)

    monkeypatch.setattr(plans.repository, "node_answers", count)
    first = api.client.get(CHECK, params={"env_key": key, "model": "cpu", "budget_s": 40},
                           headers=tokens["honest-1"]).json()
    sent = {c["manifest_hash"] for c in first["devices"][0]["checks"]}
    assert len(first["devices"][0]["checks"]) == 6
    assert set().union(*read) == sent  # the six sent, not the eight decided

    # Every budget a node may ask with is the same question to the server: one ranking.
    orders = {tuple(_order(api, key, tokens["honest-2"], budget_s=budget))
              for budget in (1, 6, 11, 17, 23, 40, 300, 86_400)}
    assert computed == 1
    assert ("alpha",) in orders and len(max(orders, key=len)) == 6


def test_plans_computed_for_a_token_are_paid_from_its_budget(make_api):
    api = make_api(check_cache_seconds=0, token_bytes_per_s=1, max_body_bytes=256 * 1024,
                   max_document_bytes=256 * 1024)
    nodes = ["honest-1", "honest-2", "honest-3", "asker"]
    tokens = _tokens(api, nodes)
    for node in nodes[:3]:
        _upload(api, tokens[node], _document(node, ("alpha", "beta")))
    key = _env_key(api, "honest-1")
    # A token asking new questions (named workloads: each a plan to compute) is held to
    # its budget (256 KiB at 64 KiB a plan); what it asks again is kept, and free.
    answers = [api.client.get(CHECK, params={"env_key": key, "model": "cpu",
                                             "workload": ["alpha", f"w{n}"]},
                              headers=tokens["asker"]) for n in range(6)]
    statuses = [a.status_code for a in answers]
    assert statuses[:3] == [200] * 3 and statuses[-1] == 429, statuses
    assert "budget" in answers[-1].text and int(answers[-1].headers["Retry-After"]) > 0
    again = api.client.get(CHECK, params={"env_key": key, "model": "cpu",
                                          "workload": ["alpha", "w0"]},
                           headers=tokens["asker"])
    assert again.status_code == 200
    # Another token is not held to that one's spending.
    assert _order(api, key, tokens["honest-1"]) == ["alpha", "beta"]
