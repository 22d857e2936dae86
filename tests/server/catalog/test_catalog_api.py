"""GET /api/v1 (the API's resources) and GET /api/v1/suites (what the fleet has run):
a new user finds the workloads, variants and tensor names to ask /divergence about."""

from __future__ import annotations

import copy

from helpers.documents import run_document


def probes_result(document):
    """A `probes`-like result (no tensor named output: probes of kind probe) added to a run."""
    cnn = next(r for r in document["results"] if r["status"] == "ok")
    probes = copy.deepcopy(cnn)
    probes.update(workload="probes", workload_version=2)
    for tensor, name in zip(probes["tensors"], ("sum_long", "matmul_large_k", "softmax",
                                                "exp_log"), strict=True):
        tensor.update(name=name, kind="probe")
    document["results"].append(probes)
    return document


def test_the_api_root_lists_its_resources_with_the_suites_first(api):
    response = api.client.get("/api/v1")
    assert response.status_code == 200, response.text
    root = response.json()
    paths = [r["path"] for r in root["resources"]]
    assert paths[0] == "/api/v1/suites"
    assert {"/api/v1/divergence", "/api/v1/compare", "/api/v1/nodes", "/api/v1/runs",
            "/api/v1/audit"} <= set(paths)
    assert all(r["summary"] for r in root["resources"]), root["resources"]
    assert root["docs"] == "/docs" and root["openapi"] == "/openapi.json"


def test_suites_lists_workloads_versions_variants_and_tensors_as_seen(api):
    for node in ("node-1", "node-2"):
        document = probes_result(run_document(node, variants=("default", "strict")))
        assert api.post_run(document).status_code == 201
    response = api.client.get("/api/v1/suites", headers=api.reader)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["suites"] == ["standard"]
    assert body["total"] == 2 and [w["workload"] for w in body["items"]] == ["cnn", "probes"]
    cnn, probes = body["items"]
    assert cnn["suite"] == "standard" and cnn["versions"] == [1]
    assert [v["variant"] for v in cnn["variants"]] == ["default", "strict", "tf32"]
    default, _strict, tf32 = cnn["variants"]
    assert default["nodes"] == 2 and default["statuses"] == {"ok": 2}
    assert default["devices"] == ["cpu"]
    assert default["divergence"] == ("/api/v1/divergence?suite=standard&workload=cnn"
                                     "&variant=default")
    # A variant every node skipped is listed, with nothing to group.
    assert tf32["statuses"] == {"skipped": 2} and tf32["divergence"] is None
    assert cnn["tensors"] == [{"name": "conv1", "kind": "layer"},
                              {"name": "conv2", "kind": "layer"},
                              {"name": "fc1", "kind": "layer"},
                              {"name": "output", "kind": "output"}]
    assert cnn["page"] == "/workloads/cnn?suite=standard"
    assert probes["versions"] == [2]
    assert [t["name"] for t in probes["tensors"]] == ["sum_long", "matmul_large_k", "softmax",
                                                      "exp_log"]
    assert {t["kind"] for t in probes["tensors"]} == {"probe"}

    # Every link it gives answers.
    for link in (default["divergence"], probes["variants"][0]["divergence"]):
        assert api.client.get(link, headers=api.reader).status_code == 200, link


def test_suites_pages_filters_and_needs_a_reader(api):
    document = run_document("node-1", workloads=("cnn", "mlp"))
    document["results"].append({**copy.deepcopy(document["results"][0]), "suite": "lab"})
    assert api.post_run(document).status_code == 201
    first = api.client.get("/api/v1/suites", params={"limit": 1}, headers=api.reader).json()
    assert (first["total"], first["limit"], first["offset"]) == (3, 1, 0)
    assert first["suites"] == ["lab", "standard"]
    assert [(w["suite"], w["workload"]) for w in first["items"]] == [("lab", "cnn")]
    rest = api.client.get("/api/v1/suites", params={"offset": 1}, headers=api.reader).json()
    assert [(w["suite"], w["workload"]) for w in rest["items"]] == [("standard", "cnn"),
                                                                     ("standard", "mlp")]
    lab = api.client.get("/api/v1/suites", params={"suite": "lab"}, headers=api.reader).json()
    assert [w["page"] for w in lab["items"]] == ["/workloads/cnn?suite=lab"]
    unknown = api.client.get("/api/v1/suites", params={"suite": "ghost"}, headers=api.reader)
    assert unknown.status_code == 404
    assert unknown.json()["detail"] == "no node has results in suite 'ghost'; suites: lab, standard"
    assert api.client.get("/api/v1/suites").status_code == 401
    assert api.client.get("/api/v1/suites", headers=api.agent).status_code == 403


def test_an_empty_server_lists_no_suites(api):
    body = api.client.get("/api/v1/suites", headers=api.reader).json()
    assert body == {"items": [], "total": 0, "limit": 50, "offset": 0, "suites": []}
