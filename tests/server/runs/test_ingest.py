"""POST /api/v1/runs and /fingerprints/missing: validation, idempotence, content addressing."""

from __future__ import annotations

import gzip
import json

from helpers.documents import bare, run_document
from sqlalchemy import func, select

from numparity_server.kit.db import get_engine, session_factory
from numparity_server.models import Fingerprint, Latest, Manifest, Node, Result, Run


def count(api, model) -> int:
    with session_factory(get_engine(api.settings))() as session:
        return session.scalar(select(func.count()).select_from(model))


def test_realistic_document_is_stored_once(api):
    document = run_document()
    response = api.post_run(document)
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["run_id"] == document["run_id"] and body["results"] == 2
    assert isinstance(body["id"], int)
    assert (count(api, Run), count(api, Result), count(api, Manifest),
            count(api, Fingerprint), count(api, Node), count(api, Latest)) == (1, 2, 1, 4, 1, 2)

    summary = api.client.get(f"/api/v1/runs/{document['run_id']}", headers=api.reader)
    assert summary.status_code == 200
    results = {r["variant"]: r for r in summary.json()["results"]}
    assert results["default"]["tensors"] == 4 and results["default"]["status"] == "ok"
    assert results["tf32"]["status"] == "skipped" and "TF32" in results["tf32"]["reason"]
    assert summary.json()["node"] == "node-1"


def test_a_run_without_results_is_stored(api):
    """A document may hold no result at all (every workload filtered out): it is a run
    of the node all the same, not a 500."""
    document = run_document()
    document["results"] = []
    response = api.post_run(document)
    assert response.status_code == 201, response.text
    assert response.json()["results"] == 0
    assert api.post_run(document).status_code == 200


def test_stored_fingerprint_keeps_the_exact_bytes(api):
    document = run_document()
    assert api.post_run(document).status_code == 201
    output = document["results"][0]["tensors"][3]
    with session_factory(get_engine(api.settings))() as session:
        row = session.get(Fingerprint, output["hash"])
    assert row.shape == [4, 10] and row.dtype == "float32"
    assert row.values == __import__("base64").b64decode(output["values"]["data"])
    assert row.count == 40 and row.max == output["stats"]["max"]


def test_same_document_again_is_200_and_a_changed_one_409(api):
    document = run_document()
    first = api.post_run(document)
    assert first.status_code == 201
    again = api.post_run(json.loads(json.dumps(document, indent=2)))  # re-serialised
    assert again.status_code == 200 and again.json() == first.json()
    changed = dict(document, agent_version="0.2.0")
    conflict = api.post_run(changed)
    assert conflict.status_code == 409
    assert conflict.json()["error"] == "conflict"
    assert document["run_id"] in conflict.json()["detail"]
    assert count(api, Run) == 1


def test_gzip_body_is_accepted(api):
    document = run_document()
    response = api.client.post(
        "/api/v1/runs", content=gzip.compress(json.dumps(document).encode()),
        headers={**api.agent, "Content-Encoding": "gzip", "Content-Type": "application/json"},
    )
    assert response.status_code == 201, response.text


def test_body_over_the_limit_is_413(make_api):
    api = make_api(max_body_bytes=10_000)
    response = api.post_run(run_document())
    assert response.status_code == 413
    assert response.json()["error"] == "payload_too_large"
    # A small gzip that inflates past the limit is refused as well.
    bomb = gzip.compress(b" " * 50_000)
    response = api.client.post("/api/v1/runs", content=bomb,
                               headers={**api.agent, "Content-Encoding": "gzip"})
    assert response.status_code == 413


def test_malformed_document_is_422_naming_the_field(api):
    document = run_document()
    document["results"][0]["status"] = 7
    response = api.post_run(document)
    assert response.status_code == 422
    body = response.json()
    assert body["error"] == "validation_error"
    assert ["body", "results", 0, "status"] in [e["loc"] for e in body["detail"]]


def test_missing_field_is_422_naming_it(api):
    document = run_document()
    del document["environment"]["env_key"]
    response = api.post_run(document)
    assert response.status_code == 422
    assert ["body", "environment", "env_key"] in [e["loc"] for e in response.json()["detail"]]


def test_invalid_json_is_422(api):
    response = api.client.post("/api/v1/runs", content=b"{not json",
                               headers={**api.agent, "Content-Type": "application/json"})
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body"]


def test_unknown_schema_is_400_listing_the_supported_ones(api):
    document = dict(run_document(), schema="numparity.run/v9")
    response = api.post_run(document)
    assert response.status_code == 400
    body = response.json()
    assert body["error"] == "unsupported_schema"
    assert "numparity.run/v9" in body["detail"] and "numparity.run/v1" in body["detail"]


def test_broken_array_is_422_naming_the_tensor(api):
    document = run_document()
    output = document["results"][0]["tensors"][3]
    output["values"]["data"] = output["values"]["data"][:-8]  # 6 bytes short (still base64)
    response = api.post_run(document)
    assert response.status_code == 422
    (error,) = response.json()["detail"]
    assert error["loc"] == ["body", "results", 0, "tensors", 3]
    assert "'output'" in error["msg"] and "values" in error["msg"]
    assert count(api, Run) == 0


def test_fingerprints_are_stored_once_per_hash_across_nodes(api):
    assert api.post_run(run_document("node-1")).status_code == 201
    assert api.post_run(run_document("node-2")).status_code == 201
    # A third node diverges from conv2 on: conv1 is shared, three new fingerprints.
    assert api.post_run(run_document("node-3", shift=1e-3)).status_code == 201
    assert count(api, Run) == 3
    assert count(api, Fingerprint) == 4 + 3
    assert count(api, Manifest) == 2


def test_known_hashes_travel_bare(api):
    first = run_document("node-1")
    assert api.post_run(first).status_code == 201
    second = run_document("node-2")
    hashes = [t["hash"] for t in second["results"][0]["tensors"]] + ["f" * 64]
    missing = api.client.post("/api/v1/fingerprints/missing", json={"hashes": hashes},
                              headers=api.agent)
    assert missing.status_code == 200
    assert missing.json() == {"missing": ["f" * 64], "missing_manifests": [], "missing_values": [],
                              "missing_traces": [],
                              "max_body_bytes": api.settings.max_body_bytes}
    response = api.post_run(bare(second))
    assert response.status_code == 201, response.text
    assert count(api, Fingerprint) == 4 and count(api, Manifest) == 1


def test_bare_unknown_hash_is_422_naming_it(api):
    document = bare(run_document())
    response = api.post_run(document)
    assert response.status_code == 422
    detail = response.json()["detail"]
    assert len(detail) == 4
    assert detail[0]["loc"] == ["body", "results", 0, "tensors", 0, "hash"]
    assert document["results"][0]["tensors"][0]["hash"] in detail[0]["msg"]
    assert count(api, Run) == 0 and count(api, Node) == 0


def test_latest_keeps_the_newest_run(api):
    newer = run_document("node-1", started_at="2026-11-21T12:00:00Z")
    older = run_document("node-1", started_at="2026-11-21T08:00:00Z", shift=0.5)
    assert api.post_run(newer).status_code == 201
    assert api.post_run(older).status_code == 201  # a spooled run uploaded late
    with session_factory(get_engine(api.settings))() as session:
        run_ids = session.scalars(
            select(Run.run_id).join(Result, Result.run_pk == Run.id)
            .join(Latest, Latest.result_id == Result.id)
        ).all()
    assert set(run_ids) == {newer["run_id"]}


def test_unknown_run_is_404(api):
    response = api.client.get("/api/v1/runs/nope", headers=api.reader)
    assert response.status_code == 404 and response.json()["error"] == "not_found"


def test_runs_are_listed_newest_first_with_a_page_limit(make_api):
    api = make_api(page_max=2)
    for hour, node in ((8, "a"), (9, "b"), (10, "a")):
        document = run_document(node, started_at=f"2026-11-21T{hour:02d}:00:00Z")
        assert api.post_run(document).status_code == 201
    page = api.client.get("/api/v1/runs", params={"limit": 2}, headers=api.reader).json()
    assert page["total"] == 3 and [r["node"] for r in page["items"]] == ["a", "b"]
    assert page["items"][0]["started_at"].startswith("2026-11-21T10:00:00")
    only_a = api.client.get("/api/v1/runs", params={"node": "a"}, headers=api.reader).json()
    assert only_a["total"] == 2
    too_many = api.client.get("/api/v1/runs", params={"limit": 3}, headers=api.reader)
    assert too_many.status_code == 422
    assert too_many.json()["detail"][0]["loc"] == ["query", "limit"]


def test_values_of_known_tensors_cost_one_statement_and_none_when_stored(api):
    """Issue 39, finding 7: re-sending known tensors with their values made one UPDATE
    per tensor (151,552 one-element tensors held the write lock for minutes). Values the
    server lacks are filled in one statement; values it has cost no UPDATE at all."""
    from sqlalchemy import event

    stripped = run_document("node-1")
    hashes = {t["hash"] for r in stripped["results"] for t in r.get("tensors", [])
              if "values" in t}
    for result in stripped["results"]:
        for tensor in result.get("tensors", []):
            tensor.pop("values", None)
    assert api.post_run(stripped).status_code == 201

    engine = get_engine(api.settings)
    updates: list[tuple[int, bool]] = []

    def seen(_conn, _cursor, statement, parameters, _context, executemany):
        if statement.lstrip().upper().startswith("UPDATE FINGERPRINTS"):
            updates.append((len(parameters) if executemany else 1, executemany))

    event.listen(engine, "before_cursor_execute", seen)
    try:
        assert api.post_run(run_document("node-2")).status_code == 201
        filled = list(updates)
        updates.clear()
        assert api.post_run(run_document("node-3")).status_code == 201
        again = list(updates)
    finally:
        event.remove(engine, "before_cursor_execute", seen)
    assert len(hashes) == 3
    assert filled == [(3, True)]  # the three tensors' values, one statement
    assert again == []  # stored already: nothing written
    with session_factory(engine)() as session:
        stored = session.scalars(select(Fingerprint).where(Fingerprint.hash.in_(hashes)))
        assert all(row.values is not None for row in stored)
