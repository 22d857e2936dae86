"""Results that refer to a stored manifest by its hash (what an agent on a known
environment sends): stored complete, checked, and the same run in any form."""

from __future__ import annotations

import copy
import hashlib
import json
import uuid

from helpers.documents import run_document


def manifest_of(result: dict) -> str:
    """The contract's manifest hash, computed independently of the server's code."""
    ordered = sorted(result["tensors"], key=lambda t: t["order"])
    triples = [[t["name"], t["kind"], t["hash"]] for t in ordered]
    return hashlib.sha256(json.dumps(triples, separators=(",", ":")).encode()).hexdigest()


def by_reference(document: dict) -> dict:
    referenced = copy.deepcopy(document)
    for result in referenced["results"]:
        if result.get("tensors"):
            result["manifest"] = manifest_of(result)
            del result["tensors"]
    return referenced


def test_a_manifest_reference_stores_the_complete_result(api):
    first = run_document()
    assert api.post_run(first).status_code == 201
    second = by_reference(run_document(node="node-2"))
    second["run_id"] = str(uuid.uuid4())
    response = api.post_run(second)
    assert response.status_code == 201, response.text

    summary = api.client.get(f"/api/v1/runs/{second['run_id']}", headers=api.reader).json()
    ok = [r for r in summary["results"] if r["status"] == "ok"]
    assert [r["tensors"] for r in ok] == [4]
    assert ok[0]["manifest_hash"] == manifest_of(first["results"][0])


def test_the_missing_question_answers_for_manifests(api):
    document = run_document()
    digest = manifest_of(document["results"][0])
    asked = {"hashes": [], "manifests": [digest]}
    before = api.client.post("/api/v1/fingerprints/missing", json=asked, headers=api.agent)
    assert before.json() == {"missing": [], "missing_manifests": [digest], "missing_values": [],
                             "missing_traces": [],
                              "max_body_bytes": api.settings.max_body_bytes}
    assert api.post_run(document).status_code == 201
    after = api.client.post("/api/v1/fingerprints/missing", json=asked, headers=api.agent)
    assert after.json() == {"missing": [], "missing_manifests": [], "missing_values": [],
                            "missing_traces": [],
                              "max_body_bytes": api.settings.max_body_bytes}


def test_an_unknown_manifest_is_422_naming_it(api):
    document = by_reference(run_document())
    response = api.post_run(document)
    assert response.status_code == 422
    (problem,) = response.json()["detail"]
    assert problem["loc"] == ["body", "results", 0, "manifest"]
    assert document["results"][0]["manifest"] in problem["msg"]
    assert api.client.get(f"/api/v1/runs/{document['run_id']}",
                          headers=api.reader).status_code == 404


def test_a_manifest_that_contradicts_the_tensors_is_422(api):
    document = run_document()
    document["results"][0]["manifest"] = "0" * 64
    response = api.post_run(document)
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "results", 0, "manifest"]


def test_the_same_run_by_reference_is_an_identical_re_upload(api):
    document = run_document()
    assert api.post_run(document).status_code == 201
    again = api.post_run(by_reference(document))
    assert again.status_code == 200, again.text
    changed = by_reference(document)
    changed["results"][0]["manifest"] = manifest_of(run_document(shift=1.0)["results"][0])
    assert api.post_run(changed).status_code == 409


def test_a_manifest_removed_between_check_and_insert_is_422_not_500(api, monkeypatch):
    """Retention may delete a manifest after ingest checked it and before the result that
    refers to it is inserted (PostgreSQL runs them concurrently). The foreign key catches
    it; the answer names the manifest so the agent resends the tensors."""
    from numparity_server.runs import repository

    document = by_reference(run_document())
    real = repository.existing_manifests
    calls = []

    def stale_then_true(session, hashes):
        calls.append(1)
        return set(hashes) if len(calls) == 1 else real(session, hashes)

    monkeypatch.setattr(repository, "existing_manifests", stale_then_true)
    response = api.post_run(document)
    assert response.status_code == 422, response.text
    (problem,) = response.json()["detail"]
    assert problem["loc"] == ["body", "results", 0, "manifest"]
    assert document["results"][0]["manifest"] in problem["msg"]
    assert api.client.get(f"/api/v1/runs/{document['run_id']}",
                          headers=api.reader).status_code == 404
