"""GET /api/v1/nodes, /nodes/{name} (timeline) and /environments."""

from __future__ import annotations

import pytest
from helpers.documents import environment, run_document


@pytest.fixture
def fleet(make_api):
    """node-a: 08:00 and 09:00 on the stock environment (same numbers), 10:00 after
    MKL_CBWR=COMPATIBLE (different numbers); node-b: one run on the stock environment."""
    api = make_api(page_max=10)
    documents = [
        run_document("node-a", run_id="a-08", started_at="2026-11-21T08:00:00Z"),
        run_document("node-a", run_id="a-09", started_at="2026-11-21T09:00:00Z"),
        run_document("node-a", run_id="a-10", started_at="2026-11-21T10:00:00Z", shift=1e-3,
                     env_vars={"MKL_CBWR": "COMPATIBLE"}),
        run_document("node-b", run_id="b-09", started_at="2026-11-21T09:30:00Z"),
    ]
    documents[3]["node"]["labels"] = {"rack": "c1", "gpu": "none"}
    for document in documents:
        assert api.post_run(document).status_code == 201
    return api


STOCK = environment()["env_key"]
MKL = environment({"MKL_CBWR": "COMPATIBLE"})["env_key"]


def test_nodes_list_the_newest_run_and_its_environment(fleet):
    response = fleet.client.get("/api/v1/nodes", headers=fleet.reader)
    assert response.status_code == 200
    page = response.json()
    assert page["total"] == 2 and page["limit"] == 10 and page["offset"] == 0
    a, b = page["items"]
    assert (a["name"], a["runs"], a["env_key"]) == ("node-a", 3, MKL)
    assert a["last_run_at"].startswith("2026-11-21T10:00:00")
    assert a["labels"] == {"rack": "b2"}
    assert (b["name"], b["runs"], b["env_key"], b["labels"]) == (
        "node-b", 1, STOCK, {"rack": "c1", "gpu": "none"})
    second = fleet.client.get("/api/v1/nodes", params={"limit": 1, "offset": 1},
                              headers=fleet.reader).json()
    assert [n["name"] for n in second["items"]] == ["node-b"] and second["total"] == 2


def test_timeline_marks_environment_and_result_changes(fleet):
    response = fleet.client.get("/api/v1/nodes/node-a", headers=fleet.reader)
    assert response.status_code == 200
    body = response.json()
    assert body["name"] == "node-a" and body["runs"]["total"] == 3
    newest, middle, oldest = body["runs"]["items"]
    assert [r["run_id"] for r in (newest, middle, oldest)] == ["a-10", "a-09", "a-08"]

    assert newest["env_key"] == MKL and newest["environment_changed"] is True
    assert newest["previous_run_id"] == "a-09"
    # Drift: the attribute that changed, with the results that changed with it.
    assert newest["environment_changes"] == [
        {"attribute": "env_vars.MKL_CBWR", "before": "unset", "after": "COMPATIBLE"}]
    (change,) = newest["changed_results"]
    assert (change["workload"], change["variant"], change["device"]) == ("cnn", "default", "cpu")
    assert change["manifest_hash"] != change["previous_manifest_hash"]
    assert change["outputs_changed"] is True and change["status"] == "ok"

    assert middle["environment_changed"] is False and middle["changed_results"] == []
    assert middle["environment_changes"] == [] and oldest["environment_changes"] == []
    assert oldest["previous_run_id"] is None and oldest["environment_changed"] is None


def test_timeline_pages_still_compare_with_the_run_before(fleet):
    page = fleet.client.get("/api/v1/nodes/node-a", params={"limit": 1, "offset": 1},
                            headers=fleet.reader).json()["runs"]
    (run,) = page["items"]
    assert run["run_id"] == "a-09" and run["previous_run_id"] == "a-08"
    assert run["environment_changed"] is False


def test_unknown_node_is_404_naming_it(fleet):
    response = fleet.client.get("/api/v1/nodes/no-such-node", headers=fleet.reader)
    assert response.status_code == 404
    assert response.json() == {"error": "not_found", "detail": "no node named 'no-such-node'"}


def test_environments_count_their_nodes(fleet):
    response = fleet.client.get("/api/v1/environments", headers=fleet.reader)
    assert response.status_code == 200
    page = response.json()
    assert page["total"] == 2
    stock, mkl = page["items"]
    assert stock["env_key"] == STOCK and mkl["env_key"] == MKL
    assert (stock["nodes"], stock["current_nodes"], stock["runs"]) == (2, 1, 3)
    assert (mkl["nodes"], mkl["current_nodes"], mkl["runs"]) == (1, 1, 1)
    assert stock["torch"] == "2.13.0" and stock["cpu_capability"] == "AVX512"
    assert stock["gpu_name"] is None and stock["cpu_model"] == "Xeon"
    filtered = fleet.client.get("/api/v1/environments", params={"torch": "2.12.0"},
                                headers=fleet.reader).json()
    assert filtered["total"] == 0 and filtered["items"] == []


@pytest.mark.parametrize("path", ["/api/v1/nodes", "/api/v1/nodes/node-a",
                                  "/api/v1/environments"])
def test_reads_are_paginated_with_the_server_maximum_and_need_a_reader(fleet, path):
    too_many = fleet.client.get(path, params={"limit": 11}, headers=fleet.reader)
    assert too_many.status_code == 422
    assert too_many.json()["detail"] == [{"loc": ["query", "limit"],
                                          "msg": "at most 10 items per page"}]
    assert fleet.client.get(path, params={"limit": 0}, headers=fleet.reader).status_code == 422
    assert fleet.client.get(path).status_code == 401
    assert fleet.client.get(path, headers=fleet.agent).status_code == 403
    assert fleet.client.get(path, headers=fleet.admin).status_code == 200


def test_an_empty_server_has_empty_pages(api):
    for path in ("/api/v1/nodes", "/api/v1/environments"):
        page = api.client.get(path, headers=api.reader).json()
        assert page["items"] == [] and page["total"] == 0
