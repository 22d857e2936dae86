"""Op traces on the wire (design §2.7): bodies checked against their hashes, stored once,
referred to by results, asked for through /fingerprints/missing; the same run with or
without its bodies."""

from __future__ import annotations

import copy
import hashlib
import json
import zlib

import pytest
from helpers.documents import bare, run_document
from helpers.traces import cnn_trace, op, ref, rehash, trace, trace_hash, with_traces
from sqlalchemy import func, select

from numparity_server.kit.db import get_engine, session_factory
from numparity_server.kit.errors import InvalidDocument
from numparity_server.models import Outcome, Run, Trace
from numparity_server.runs.service import validate_document

CNN = ("cnn", "default")


def stored_traces(api) -> dict[str, Trace]:
    with session_factory(get_engine(api.settings))() as session:
        return {row.hash: row for row in session.scalars(select(Trace))}


def outcome_traces(api) -> dict[tuple[str, str], str | None]:
    with session_factory(get_engine(api.settings))() as session:
        return {(o.workload, o.variant): o.trace_hash for o in session.scalars(select(Outcome))}


def problems(response) -> list[dict]:
    assert response.status_code == 422, response.text
    return response.json()["detail"]


def test_a_traced_result_stores_its_trace_once_and_points_at_it(api):
    body = cnn_trace()
    first = with_traces(run_document("node-1"), {CNN: body})
    assert api.post_run(first).status_code == 201
    # Another node with the same trace: still one row.
    second = with_traces(run_document("node-2"), {CNN: body})
    assert api.post_run(second).status_code == 201

    (row,) = stored_traces(api).values()
    assert row.hash == body["hash"] and row.op_count == 6
    # The stored body is the canonical JSON the hash covers: it checks against its key.
    canonical = zlib.decompress(row.body)
    assert hashlib.sha256(canonical).hexdigest() == body["hash"]
    assert json.loads(canonical) == {k: v for k, v in body.items() if k != "hash"}
    assert outcome_traces(api) == {CNN: body["hash"], ("cnn", "tf32"): None}
    summary = api.client.get(f"/api/v1/runs/{first['run_id']}", headers=api.reader).json()
    assert [r["trace_hash"] for r in summary["results"]] == [body["hash"], None]


def test_a_result_may_refer_to_a_stored_trace_without_its_body(api):
    body = cnn_trace()
    assert api.post_run(with_traces(run_document("node-1"), {CNN: body})).status_code == 201
    steady = with_traces(run_document("node-2"), {CNN: body}, send_bodies=False)
    assert "traces" not in steady
    response = api.post_run(steady)
    assert response.status_code == 201, response.text
    assert len(stored_traces(api)) == 1


def test_the_same_run_with_or_without_bodies_is_a_replay_and_another_trace_a_conflict(api):
    document = with_traces(run_document(), {CNN: cnn_trace()})
    assert api.post_run(document).status_code == 201
    without = copy.deepcopy(document)
    del without["traces"]
    assert api.post_run(without).status_code == 200
    assert api.post_run(document).status_code == 200

    other = with_traces(document, {CNN: cnn_trace(conv2_kernel="conv:Mkldnn")})
    assert api.post_run(other).status_code == 409


@pytest.mark.parametrize("module", ["blöcke.0.注意", "tab\there", "\u001f\u007f"])
def test_a_body_with_any_text_hashes_as_the_contract_says(api, module):
    body = cnn_trace()
    body["ops"][1]["module"] = module
    response = api.post_run(with_traces(run_document(), {CNN: rehash(body)}))
    assert response.status_code == 201, response.text


def test_an_unknown_trace_is_422_naming_it_and_stores_nothing(api):
    body = cnn_trace()
    document = with_traces(run_document(), {CNN: body}, send_bodies=False)
    (problem,) = problems(api.post_run(document))
    assert problem["loc"] == ["body", "results", 0, "trace"]
    assert problem["msg"].startswith(f"unknown trace {body['hash']}: ")
    assert not stored_traces(api)
    with session_factory(get_engine(api.settings))() as session:
        assert session.scalar(select(func.count()).select_from(Run)) == 0


def test_a_body_that_is_not_its_hash_is_422_naming_it(api):
    body = cnn_trace()
    body["ops"][0]["module"] = "tampered"  # the hash no longer covers the body
    document = with_traces(run_document(), {CNN: body})
    (problem,) = problems(api.post_run(document))
    assert problem["loc"] == ["body", "traces", 0, "hash"]
    assert body["hash"] in problem["msg"] and rehash(body)["hash"] in problem["msg"]
    assert not stored_traces(api)


def test_the_hash_covers_fields_the_server_does_not_know(api):
    body = cnn_trace()
    body["ops"][0]["future"] = {"ignored": "but hashed"}
    assert api.post_run(with_traces(run_document(), {CNN: body})).status_code == 422
    accepted = rehash(body)
    assert api.post_run(with_traces(run_document(), {CNN: accepted})).status_code == 201
    (row,) = stored_traces(api).values()
    assert json.loads(zlib.decompress(row.body))["ops"][0]["future"] == {
        "ignored": "but hashed"}


def test_a_body_no_result_refers_to_and_a_body_twice_are_422(api):
    body, stray = cnn_trace(), cnn_trace(conv2_kernel="conv:Mkldnn")
    document = with_traces(run_document(), {CNN: body})
    document["traces"].append(stray)
    (problem,) = problems(api.post_run(document))
    assert problem["loc"] == ["body", "traces", 1, "hash"]
    assert stray["hash"] in problem["msg"] and "no result refers to it" in problem["msg"]

    twice = with_traces(run_document(), {CNN: body})
    twice["traces"].append(body)
    (problem,) = problems(api.post_run(twice))
    assert problem["loc"] == ["body", "traces", 1, "hash"] and "twice" in problem["msg"]


def test_outcomes_without_a_trace_keep_their_hashes(api):
    """The outcome hash covers the trace only when set: an untraced result's outcome is
    the sha256 of its columns alone, as before traces existed (computed here with the
    standard library)."""
    document = run_document()
    assert api.post_run(document).status_code == 201
    result = document["results"][0]
    manifest = hashlib.sha256(json.dumps(
        [[t["name"], t["kind"], t["hash"]] for t in result["tensors"]],
        separators=(",", ":")).encode()).hexdigest()
    columns = {"suite": "standard", "workload": "cnn", "workload_version": 1,
               "variant": "default", "device": "cpu", "status": "ok", "reason": None,
               "error": None, "input_hash": result["input_hash"],
               "param_hash": result["param_hash"], "manifest_hash": manifest, "repeats": 2,
               "repeats_agree": True, "knobs": {"threads": 2}}
    expected = hashlib.sha256(json.dumps(columns, sort_keys=True, separators=(",", ":"))
                              .encode()).hexdigest()
    traced = with_traces(run_document("node-2"), {CNN: cnn_trace()})
    assert api.post_run(traced).status_code == 201
    with session_factory(get_engine(api.settings))() as session:
        hashes = {o.trace_hash: o.hash for o in session.scalars(
            select(Outcome).where(Outcome.variant == "default"))}
    assert hashes[None] == expected
    assert hashes[cnn_trace()["hash"]] != expected


def test_the_missing_question_answers_for_traces(api):
    body = cnn_trace()
    asked = {"hashes": [], "traces": [body["hash"], body["hash"]]}
    before = api.client.post("/api/v1/fingerprints/missing", json=asked, headers=api.agent)
    assert before.status_code == 200
    assert before.json()["missing_traces"] == [body["hash"]]
    assert api.post_run(with_traces(run_document(), {CNN: body})).status_code == 201
    after = api.client.post("/api/v1/fingerprints/missing", json=asked, headers=api.agent)
    assert after.json()["missing_traces"] == []
    unasked = api.client.post("/api/v1/fingerprints/missing", json={"hashes": []},
                              headers=api.agent)
    assert unasked.json()["missing_traces"] == []
    bad = api.client.post("/api/v1/fingerprints/missing", json={"traces": ["ab" * 8]},
                          headers=api.agent)
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"][:2] == ["body", "traces"]


def test_a_trace_removed_between_check_and_insert_is_422_not_500(api, monkeypatch):
    """Retention may delete a trace after ingest checked it and before the outcome that
    refers to it is inserted; the foreign key catches it and the answer names it."""
    from numparity_server.runs import repository

    body = cnn_trace()
    real = repository.existing_traces
    calls = []

    def stale_then_true(session, hashes):
        calls.append(1)
        return set(hashes) if len(calls) == 1 else real(session, hashes)

    monkeypatch.setattr(repository, "existing_traces", stale_then_true)
    document = with_traces(run_document("node-2"), {CNN: body}, send_bodies=False)
    (problem,) = problems(api.post_run(document))
    assert problem["loc"] == ["body", "results", 0, "trace"]
    assert body["hash"] in problem["msg"] and "no longer" in problem["msg"]


# ---- limits of the contract: each a 422 naming the field --------------------------------


def _traced(body: dict) -> dict:
    return with_traces(run_document(), {CNN: body})


def _body_with(**changes) -> dict:
    body = cnn_trace()
    body.update(changes)
    return rehash(body)


def _op_with(**changes) -> dict:
    body = cnn_trace()
    body["ops"][0].update(changes)
    return rehash(body)


def _refused(document: dict) -> list[dict]:
    with pytest.raises(InvalidDocument) as refused:
        validate_document(document)
    return refused.value.detail


@pytest.mark.parametrize(("body", "where"), [
    (_body_with(hash_chars=8), ["traces", 0, "hash_chars"]),
    (_body_with(format="numparity.trace/v2"), ["traces", 0, "format"]),
    (_op_with(op="a" * 257), ["traces", 0, "ops", 0, "op"]),
    (_op_with(module="m" * 513), ["traces", 0, "ops", 0, "module"]),
    (_op_with(kernel="k" * 4097), ["traces", 0, "ops", 0, "kernel"]),
    (_op_with(phase="inference"), ["traces", 0, "ops", 0, "phase"]),
    (_op_with(**{"in": [ref("input").upper()]}), ["traces", 0, "ops", 0, "in", 0]),
    (_op_with(out=[ref("x")] * 65), ["traces", 0, "ops", 0, "out"]),
    (_op_with(args="123"), ["traces", 0, "ops", 0, "args"]),
    (_body_with(tensors={"0" * 16: ["float32", [1]], "XYZ": ["float32", [1]]}),
     ["traces", 0, "tensors", "XYZ", "[key]"]),
])
def test_a_trace_past_a_limit_is_422_naming_the_field(body, where):
    locs = [problem["loc"] for problem in _refused(_traced(body))]
    assert ["body", *where] in locs, locs


def test_a_reference_that_is_not_a_key_of_tensors_is_422_naming_it():
    body = cnn_trace()
    stray = ref("nowhere")
    body["ops"][3]["out"] = [stray]
    (problem,) = _refused(_traced(rehash(body)))
    assert problem["loc"] == ["body", "traces", 0]
    assert f"ops[3].out refers to {stray}" in problem["msg"]


@pytest.mark.parametrize(("field", "count", "where"), [
    ("ops", 50_001, ["traces", 0, "ops"]),
    ("tensors", 200_001, ["traces", 0, "tensors"]),
])
def test_too_many_ops_or_tensors_is_422_naming_the_limit(field, count, where):
    if field == "ops":
        body = trace([op("aten.relu.default", "", [], [])] * count, {})
    else:
        body = trace([], {f"{i:016x}": ("float32", [1]) for i in range(count)})
    locs = [problem["loc"] for problem in _refused(_traced(body))]
    assert locs == [["body", *where]]


def test_more_than_256_traces_is_422_naming_the_limit():
    document = _traced(cnn_trace())
    document["traces"] = [trace([op(f"aten.op{i}.default", "", [], [])], {})
                          for i in range(257)]
    locs = [problem["loc"] for problem in _refused(document)]
    assert locs == [["body", "traces"]]


def test_the_helper_hash_is_the_contracts():
    """The helper states the contract literally; a body with a non-ASCII module path
    hashes its UTF-8 bytes unescaped."""
    body = trace([op("aten.relu.default", "blöcke.0", [], [])], {})
    content = ('{"format":"numparity.trace/v1","hash_chars":16,"ops":[{"in":[],'
               '"module":"blöcke.0","op":"aten.relu.default","out":[],'
               '"phase":"forward"}],"tensors":{}}')
    assert body["hash"] == hashlib.sha256(content.encode("utf-8")).hexdigest()
    assert trace_hash(body) == body["hash"]


def ingest_statements(api, document) -> int:
    from sqlalchemy import event

    engine = api.client.app.state.engine
    statements = []

    def count(_conn, _cursor, statement, *_args):
        statements.append(statement)

    event.listen(engine, "before_cursor_execute", count)
    try:
        assert api.post_run(document).status_code == 201
    finally:
        event.remove(engine, "before_cursor_execute", count)
    return len(statements)


def test_ingest_statements_do_not_grow_with_traces(api):
    """Traces are looked up and inserted in bulk, like manifests: a run of 12 traced
    results on a new environment writes as many statements as a run of one. (The
    tensors are stored first and then sent by reference, so both runs do the same
    fingerprint and manifest work.)"""
    workloads, variants = ("cnn", "mlp", "vit", "lstm"), ("default", "strict",
                                                          "fp64-reference")
    assert api.post_run(run_document("primer", workloads=workloads,
                                     variants=variants)).status_code == 201

    def traced_run(node, workloads, variants):
        document = bare(run_document(node, workloads=workloads, variants=variants,
                                     env_vars={"NODE": node}))
        return with_traces(document, {(w, v): cnn_trace(conv2_kernel=f"{node}/{w}/{v}")
                                      for w in workloads for v in variants})

    small = ingest_statements(api, traced_run("node-1", ("cnn",), ("default",)))
    big = ingest_statements(api, traced_run("node-2", workloads, variants))
    assert len(stored_traces(api)) == 13
    assert big == small
