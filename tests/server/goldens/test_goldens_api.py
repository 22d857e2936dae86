"""Pinned answers over the API (design §3.11): pin from the majority or from a run with an
admin token, versions and unpins, who/when/why, the drift the audit and /divergence
report against a pin when the whole fleet moved, and what `check` is answered."""

from __future__ import annotations

from typing import Any

import pytest
from helpers.documents import audit_document

from numparity_server.retention.service import apply_retention

MKL = {"MKL_CBWR": "COMPATIBLE"}


def upload(api: Any, documents: list[dict[str, Any]]) -> None:
    for document in documents:
        response = api.post_run(document)
        assert response.status_code == 201, response.text


@pytest.fixture
def stock(api: Any) -> Any:
    """Three stock nodes and one whose answers differ (a lone odd device)."""
    upload(api, [*(audit_document(f"node-{i}", 3) for i in (1, 2, 3)),
                 audit_document("odd", 3, shift=1e-3)])
    return api


def pin(api: Any, **body: Any) -> Any:
    return api.client.post("/api/v1/goldens", json={"reason": "validated 2026-11", **body},
                           headers=api.admin)


def manifests(api: Any, node: str) -> dict[str, str]:
    run_id = api.client.get("/api/v1/runs", params={"node": node},
                            headers=api.reader).json()["items"][0]["run_id"]
    run = api.client.get(f"/api/v1/runs/{run_id}", headers=api.reader).json()
    return {r["variant"]: r["manifest_hash"] for r in run["results"] if r["status"] == "ok"}


def test_an_admin_pins_the_majority_with_who_when_and_why(stock: Any) -> None:
    response = pin(stock, source="majority", node="node-1")
    assert response.status_code == 201, response.text
    found = response.json()
    assert found["version"] == 1 and found["in_force"] and not found["retired"]
    assert found["model"] == "cpu" and found["source"] == "majority"
    # The stack of node-1's environment: torch, CUDA, cuDNN and the CPU's model.
    assert found["scope"] == {"cpu_model": "Xeon", "cuda": None, "cudnn": None,
                              "torch": "2.13.0"}
    assert found["pinned_by"].startswith("token ") and "test-admin" in found["pinned_by"]
    assert found["reason"] == "validated 2026-11" and found["pinned_at"]
    stock_answers = manifests(stock, "node-1")
    assert {(a["variant"], a["manifest_hash"], a["holders"], a["devices"])
            for a in found["answers"]} == {(v, m, 3, 4) for v, m in stock_answers.items()}

    listed = stock.client.get("/api/v1/goldens", headers=stock.reader).json()
    assert listed["total"] == 1 and listed["items"][0]["answers_count"] == 2
    shown = stock.client.get(f"/api/v1/goldens/{found['id']}", headers=stock.reader).json()
    assert shown["answers"] == found["answers"]


def test_pins_are_admin_only(stock: Any) -> None:
    body = {"source": "majority", "node": "node-1", "reason": "x"}
    for role in ("reader", "agent"):
        response = stock.client.post("/api/v1/goldens", json=body,
                                     headers=getattr(stock, role))
        assert response.status_code == 403, response.text
    assert stock.client.post("/api/v1/goldens", json=body).status_code == 401
    assert stock.client.get("/api/v1/goldens", headers=stock.reader).json()["total"] == 0


def test_a_pin_again_is_a_new_version_and_an_unpin_is_the_last(stock: Any) -> None:
    first = pin(stock, source="majority", node="node-1").json()
    run_id = stock.client.get("/api/v1/runs", params={"node": "odd"},
                              headers=stock.reader).json()["items"][0]["run_id"]
    second = pin(stock, source="run", run_id=run_id, reason="the odd node is right").json()
    assert second["subject"] == first["subject"] and second["version"] == 2
    assert second["source_run_id"] == run_id and second["source_device"] == "cpu"
    assert {a["manifest_hash"] for a in second["answers"]} == set(
        manifests(stock, "odd").values())
    versions = stock.client.get("/api/v1/goldens", headers=stock.reader).json()["items"]
    assert [(v["version"], v["in_force"]) for v in versions] == [(2, True), (1, False)]

    gone = stock.client.post(f"/api/v1/goldens/{first['id']}/unpin",
                             json={"reason": "retired"}, headers=stock.admin)
    assert gone.status_code == 201, gone.text
    assert gone.json()["version"] == 3 and gone.json()["retired"]
    assert stock.client.get("/api/v1/goldens", params={"in_force": "true"},
                            headers=stock.reader).json()["total"] == 0
    again = stock.client.post(f"/api/v1/goldens/{first['id']}/unpin",
                              json={"reason": "twice"}, headers=stock.admin)
    assert again.status_code == 409


@pytest.mark.parametrize(("body", "status", "says"), [
    ({"source": "run", "run_id": "no-such-run"}, 404, "no-such-run"),
    ({"source": "run"}, 422, "run_id"),
    ({"source": "majority"}, 422, "env_key"),
    ({"source": "majority", "node": "nobody"}, 404, "nobody"),
    ({"source": "majority", "node": "node-1", "match": {"colour": "red"}}, 422, "colour"),
    ({"source": "majority", "node": "node-1", "workloads": ["nothing"]}, 422, "nothing to pin"),
    ({"source": "majority", "node": "node-1", "reason": 3}, 422, "reason"),
])
def test_a_pin_that_cannot_be_made_says_why(stock: Any, body: dict[str, Any], status: int,
                                             says: str) -> None:
    response = pin(stock, **body)
    assert response.status_code == status, response.text
    assert says in response.text


def test_drift_from_the_pin_shows_when_the_whole_fleet_moved(stock: Any) -> None:
    pinned = pin(stock, source="majority", node="node-1").json()
    # Every node takes a setting that changes the answers: peers agree with each other.
    upload(stock, [audit_document(name, 1, env_vars=MKL, shift=2e-3)
                   for name in ("node-1", "node-2", "node-3", "odd")])
    report = stock.client.get("/api/v1/divergence", params={"workload": "cnn",
                                                            "variant": "strict"},
                              headers=stock.reader).json()
    assert len(report["groups"]) == 1  # the fleet agrees with itself
    (entry,) = report["pins"]
    assert entry["pin"]["id"] == pinned["id"] and entry["drift"] is True
    assert entry["pinned_group"] is None and entry["in_scope_group"] == 1
    assert entry["devices_in_scope"] == 4 and entry["devices_on_pin"] == 0
    assert entry["against_pin"]["verdict"] in ("equivalent", "divergent")
    assert entry["against_pin"]["first_divergent_layer"] == "conv2"

    audit = stock.client.get("/api/v1/audit", headers=stock.reader).json()
    rows = audit["pinned"]
    assert {(r["variant"], r["devices"], r["environment_devices"], r["peers_agree"])
            for r in rows} == {("default", 4, 4, True), ("strict", 4, 4, True)}
    assert audit["summary"]["off_pin_devices"] == 8 and audit["totals"]["pinned"] == 2
    assert all(r["pin_id"] == pinned["id"] and r["first_divergent_layer"] == "conv2"
               for r in rows)
    csv = stock.client.get("/api/v1/audit", params={"format": "csv", "table": "pinned"},
                           headers=stock.reader).text
    assert csv.count("\r\n") == 3 and "conv2" in csv
    findings = stock.client.get("/api/v1/audit", params={"format": "csv"},
                                headers=stock.reader).text
    assert "off pin" in findings and "the whole environment moved" in findings


def test_a_lone_device_off_the_pin_is_not_the_fleet_moving(stock: Any) -> None:
    pin(stock, source="majority", node="node-1", variants=["strict"])
    rows = stock.client.get("/api/v1/audit", headers=stock.reader).json()["pinned"]
    assert [(r["first_node"], r["devices"], r["environment_devices"], r["peers_agree"])
            for r in rows] == [("odd", 1, 4, False)]


def test_an_environment_pin_outranks_the_stack_pin(stock: Any) -> None:
    stack = pin(stock, source="majority", node="node-1").json()
    upload(stock, [audit_document("mkl-1", 1, env_vars=MKL, shift=2e-3)])
    mkl_run = stock.client.get("/api/v1/runs", params={"node": "mkl-1"},
                               headers=stock.reader).json()["items"][0]["run_id"]
    own = pin(stock, source="run", run_id=mkl_run, scope="environment").json()
    assert own["subject"] != stack["subject"] and own["version"] == 1
    rows = stock.client.get("/api/v1/audit", headers=stock.reader).json()["pinned"]
    # mkl-1 is judged by its environment's own pin, which it holds; only odd is off.
    assert {r["first_node"] for r in rows} == {"odd"}


def test_a_pinned_answer_outlives_the_runs_that_reported_it(stock: Any) -> None:
    pinned = pin(stock, source="majority", node="node-1").json()
    upload(stock, [audit_document(name, 1, env_vars=MKL, shift=2e-3)
                   for name in ("node-1", "node-2", "node-3", "odd")])
    from datetime import datetime, timedelta, timezone

    from numparity_server.kit.db import get_engine, session_factory

    dropped = apply_retention(sessions=session_factory(get_engine(stock.settings)), days=1,
                              batch_size=100, now=datetime.now(timezone.utc) + timedelta(days=2))
    assert dropped.runs == 4  # the stock runs are gone, the newer ones held the latest
    rows = stock.client.get("/api/v1/audit", headers=stock.reader).json()["pinned"]
    assert rows and all(r["verdict"] is not None and r["first_divergent_layer"] == "conv2"
                        for r in rows)
    shown = stock.client.get(f"/api/v1/goldens/{pinned['id']}", headers=stock.reader).json()
    assert len(shown["answers"]) == 2


# ---- check ----------------------------------------------------------------------------


def env_key(api: Any, node: str) -> str:
    return api.client.get("/api/v1/nodes", headers=api.reader).json()["items"][
        [n["name"] for n in api.client.get("/api/v1/nodes", headers=api.reader)
         .json()["items"]].index(node)]["env_key"]


def test_check_is_answered_the_pinned_answers_or_the_fleets(stock: Any) -> None:
    key = env_key(stock, "node-1")
    ask = {"env_key": key, "model": "cpu"}
    plan = stock.client.get("/api/v1/agent/check", params=ask, headers=stock.agent)
    assert plan.status_code == 200, plan.text
    (device,) = plan.json()["devices"]
    assert device["source"] == "fleet" and plan.json()["chosen_by"] == "server"
    # strict first: the deterministic variant; the fleet's majority (3 of 4).
    first = device["checks"][0]
    assert first["variant"] == "strict" and first["source"] == "fleet"
    assert (first["holders"], first["devices"]) == (3, 4)
    assert first["manifest_hash"] == manifests(stock, "node-1")["strict"]
    assert [name for name, _hash in first["tensors"]] == ["conv1", "conv2", "fc1", "output"]
    assert all(len(digest) == 16 for _name, digest in first["tensors"])

    pinned = pin(stock, source="majority", node="node-1").json()
    (device,) = stock.client.get("/api/v1/agent/check", params=ask,
                                 headers=stock.agent).json()["devices"]
    assert device["source"] == "pin" and device["pin"]["id"] == pinned["id"]
    assert {c["source"] for c in device["checks"]} == {"pin"}


def test_check_of_an_unknown_environment(stock: Any) -> None:
    pin(stock, source="majority", node="node-1")
    unknown = {"env_key": "f" * 64, "model": "cpu"}
    (device,) = stock.client.get("/api/v1/agent/check", params=unknown,
                                 headers=stock.agent).json()["devices"]
    assert device["source"] == "none" and device["checks"] == []
    assert "knows no run" in device["note"]
    # An image update the server has not seen, on the pinned stack: the pin holds it.
    stack = {**unknown, "torch": "2.13.0", "cpu_model": "Xeon"}
    plan = stock.client.get("/api/v1/agent/check", params=stack, headers=stock.agent).json()
    assert plan["environment_known"] is False
    assert plan["devices"][0]["source"] == "pin" and plan["devices"][0]["checks"]


def test_check_of_named_workloads_and_its_bounds(stock: Any) -> None:
    key = env_key(stock, "node-1")
    named = stock.client.get("/api/v1/agent/check", params={
        "env_key": key, "model": "cpu", "workload": "cnn", "variant": "default"},
        headers=stock.agent).json()
    assert named["chosen_by"] == "agent"
    assert [(c["workload"], c["variant"]) for c in named["devices"][0]["checks"]] == [
        ("cnn", "default")]
    # Variants alone narrow the server's choice.
    narrowed = stock.client.get("/api/v1/agent/check", params={
        "env_key": key, "model": "cpu", "variant": "default"}, headers=stock.agent).json()
    assert narrowed["chosen_by"] == "server"
    assert {c["variant"] for c in narrowed["devices"][0]["checks"]} == {"default"}
    for params, status in (({"model": "cpu"}, 422), ({"env_key": key}, 422),
                           ({"env_key": key, "model": "cpu", "budget_s": "-1"}, 422),
                           ({"env_key": key, "model": ["cpu"] * 17}, 422)):
        response = stock.client.get("/api/v1/agent/check", params=params, headers=stock.agent)
        assert response.status_code == status, (params, response.text)
    assert stock.client.get("/api/v1/agent/check", params={"env_key": key, "model": "cpu"},
                            headers=stock.reader).status_code == 403


def test_check_answers_are_kept_per_environment(stock: Any) -> None:
    ask = {"env_key": env_key(stock, "node-1"), "model": "cpu"}
    first = stock.client.get("/api/v1/agent/check", params=ask, headers=stock.agent)
    upload(stock, [audit_document("node-4", 1)])  # a newer upload: within the cache's 30 s
    again = stock.client.get("/api/v1/agent/check", params=ask, headers=stock.agent)
    assert again.json() == first.json() and "age" in again.headers
    # A new pin is never served stale.
    pin(stock, source="majority", node="node-1")
    after = stock.client.get("/api/v1/agent/check", params=ask, headers=stock.agent).json()
    assert after["devices"][0]["source"] == "pin"


def test_check_computes_the_compiled_variant_only_when_the_agent_names_it(api: Any) -> None:
    # Three nodes whose compiled answers are the fleet's and the cheapest of all: the
    # server still never gives them unasked (a cold compile takes minutes).
    documents = [audit_document(f"node-{i}", 3) for i in (1, 2, 3)]
    for document in documents:
        default = next(r for r in document["results"] if r.get("variant") == "default")
        document["results"].append({**default, "variant": "compiled", "wall_s": 0.01})
    upload(api, documents)
    ask = {"env_key": env_key(api, "node-1"), "model": "cpu"}
    chosen = api.client.get("/api/v1/agent/check", params=ask, headers=api.agent).json()
    assert chosen["devices"][0]["checks"]
    assert "compiled" not in {c["variant"] for c in chosen["devices"][0]["checks"]}
    named = api.client.get("/api/v1/agent/check", params={**ask, "variant": "compiled"},
                           headers=api.agent).json()
    assert {c["variant"] for c in named["devices"][0]["checks"]} == {"compiled"}


def test_check_ranks_by_the_coverage_the_benchmark_measured(api: Any, monkeypatch) -> None:
    # Two strict answers of the fleet: `quick` costs a tenth of `slow`. Measured, `slow`
    # sees every fault of two op classes and `quick` none: with one answer's budget the
    # server gives `slow`, though it costs more.
    from numparity_server.goldens import check

    documents = [audit_document(f"node-{i}", 3) for i in (1, 2, 3)]
    for document in documents:
        strict = next(r for r in document["results"] if r.get("variant") == "strict")
        document["results"] = [{**strict, "workload": "slow", "wall_s": 1.0},
                               {**strict, "workload": "quick", "wall_s": 0.1}]
    upload(api, documents)
    ask = {"env_key": env_key(api, "node-1"), "model": "cpu", "budget_s": "3",
           "child_s": "0"}
    monkeypatch.setattr(check, "workload_coverage", lambda: {
        "slow": {"matmul": 1.0, "reduction": 1.0}, "quick": {"matmul": 0.0}})
    chosen = api.client.get("/api/v1/agent/check", params=ask, headers=api.agent).json()
    assert [c["workload"] for c in chosen["devices"][0]["checks"]] == ["slow"]
    # Unmeasured (another question: the answer is kept per question), the cheapest first.
    monkeypatch.setattr(check, "workload_coverage", lambda: {})
    plain = api.client.get("/api/v1/agent/check", params={**ask, "budget_s": "2.9"},
                           headers=api.agent).json()
    assert [c["workload"] for c in plain["devices"][0]["checks"]] == ["quick"]


def test_the_servers_opt_in_variants_are_the_agents() -> None:
    from numparity_agent._variants import OPT_IN
    from numparity_server.analysis.goldens import OPT_IN_VARIANTS

    assert OPT_IN_VARIANTS == OPT_IN
