"""Uploads from a hostile or broken node (issue 13): every one a 4xx naming the problem,
nothing stored, and the analysis of the honest runs unharmed."""

from __future__ import annotations

import base64
import gzip
import json
from datetime import datetime, timedelta, timezone

import pytest
from helpers.documents import run_document
from sqlalchemy import func, select

from numparity_server.analysis.fingerprint import Fingerprint as AnalysisFingerprint
from numparity_server.kit.body import MAX_JSON_DEPTH, MAX_JSON_VALUES
from numparity_server.kit.db import get_engine, session_factory
from numparity_server.models import Latest, Result, Run
from numparity_server.runs import schemas
from numparity_server.runs.schemas import MAX_TENSOR_ELEMENTS


def post_raw(api, content: bytes, **headers: str):
    return api.client.post("/api/v1/runs", content=content,
                           headers={**api.agent, "Content-Type": "application/json", **headers})


def stored_runs(api) -> int:
    with session_factory(get_engine(api.settings))() as session:
        return session.scalar(select(func.count()).select_from(Run)) or 0


def iso(moment: datetime) -> str:
    return moment.replace(microsecond=0).isoformat().replace("+00:00", "Z")


# -- every body is bounded -------------------------------------------------------------

def test_fingerprints_missing_has_the_body_limit(make_api):
    api = make_api(max_body_bytes=10_000)
    hashes = ["a" * 64] * 1000  # ~67 kB
    response = api.client.post("/api/v1/fingerprints/missing", json={"hashes": hashes},
                               headers=api.agent)
    assert response.status_code == 413
    assert "NUMPARITY_MAX_BODY_BYTES" in response.json()["detail"]
    # Within the limit it still answers.
    small = api.client.post("/api/v1/fingerprints/missing", json={"hashes": ["a" * 64]},
                            headers=api.agent)
    assert small.status_code == 200 and small.json()["missing"] == ["a" * 64]


def test_fingerprints_missing_refuses_a_body_of_millions_of_values(api):
    content = b'{"hashes": [' + b",".join([b"1"] * (MAX_JSON_VALUES + 10)) + b"]}"
    response = api.client.post("/api/v1/fingerprints/missing", content=content,
                               headers={**api.agent, "Content-Type": "application/json"})
    assert response.status_code == 422
    assert str(MAX_JSON_VALUES) in response.json()["detail"][0]["msg"].replace(",", "")


def test_a_page_form_has_a_small_body_limit(api):
    response = api.client.post("/login", content=b"token=" + b"x" * 200_000,
                               headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert response.status_code == 413


@pytest.mark.parametrize(("where", "depth"), [("environment", 300), ("knobs", 1000)])
def test_deep_free_form_fields_are_422_naming_them(api, where, depth):
    document = run_document()
    if where == "environment":
        document["environment"]["deep"] = "DEEP"
        expected = ["body", "environment"]
    else:
        document["results"][0]["knobs"] = "DEEP"
        expected = ["body", "results", 0, "knobs"]
    # Written by hand: Python's json and orjson refuse to write such a document.
    body = json.dumps(document).replace('"DEEP"', '{"a": ' * depth + "{}" + "}" * depth)
    response = post_raw(api, body.encode())
    assert response.status_code == 422, response.text
    (error,) = response.json()["detail"]
    assert error["loc"][: len(expected)] == expected
    assert f"nested deeper than {MAX_JSON_DEPTH}" in error["msg"]
    assert stored_runs(api) == 0


@pytest.mark.parametrize("padding", [
    b",".join([b'""'] * (MAX_JSON_VALUES + 10)),  # refused before it is parsed
    b",".join([b'[""]'] * (MAX_JSON_VALUES // 2 + 10)),  # fewer commas than values
])
def test_a_document_of_millions_of_values_is_a_cheap_422(api, padding):
    body = json.dumps(run_document()).encode()[:-1] + b', "padding": [' + padding + b"]}"
    response = post_raw(api, body)
    assert response.status_code == 422
    assert "values" in response.json()["detail"][0]["msg"]
    assert stored_runs(api) == 0


@pytest.mark.parametrize("path", ["/api/v1/runs", "/api/v1/fingerprints/missing"])
def test_a_lone_surrogate_in_a_key_is_422_naming_it(api, path):
    prefix = json.dumps(run_document())[:-1] + ", " if path.endswith("runs") else '{"hashes": [], '
    response = api.client.post(path, content=(prefix + '"x": {"\\ud800": 1}}').encode(),
                               headers={**api.agent, "Content-Type": "application/json"})
    assert response.status_code == 422, response.text
    (error,) = response.json()["detail"]
    assert error["loc"] == ["body", "x", "\\ud800"]
    assert "surrogate" in error["msg"]


def test_gzip_trailing_data_is_400(api):
    body = gzip.compress(json.dumps(run_document()).encode())
    for trailer in (b"garbage", gzip.compress(b"{}")):
        response = post_raw(api, body + trailer, **{"Content-Encoding": "gzip"})
        assert response.status_code == 400, response.text
        assert "trailing data after the gzip stream" in response.json()["detail"]
    assert stored_runs(api) == 0


# -- shapes that cannot overflow -------------------------------------------------------

def poisoned(node: str, digest: str, shift: float = 0.0) -> dict:
    """A run whose output claims 2**62 x 3 elements (an int64 product wraps negative) and
    travels as stats and sketch only, so two of them are compared by their sketches."""
    document = run_document(node, shift=shift)
    output = document["results"][0]["tensors"][-1]
    output["shape"] = [4611686018427387904, 3]
    for part in ("values", "sample"):
        output.pop(part)
    output["hash"] = digest
    return document


def analysis_answers(api, run_a: str, run_b: str) -> None:
    divergence = api.client.get("/api/v1/divergence", headers=api.reader,
                                params={"workload": "cnn", "variant": "default"})
    assert divergence.status_code == 200, divergence.text
    compare = api.client.get("/api/v1/compare", headers=api.reader,
                             params={"run_a": run_a, "run_b": run_b})
    assert compare.status_code == 200, compare.text


def test_a_shape_beyond_the_element_limit_is_422_and_analysis_still_answers(api):
    honest = [run_document("node-a"), run_document("node-b", shift=1e-3)]
    for document in honest:
        assert api.post_run(document).status_code == 201
    for document in (poisoned("node-c", "e" * 64), poisoned("node-d", "f" * 64, 1e-3)):
        response = api.post_run(document)
        assert response.status_code == 422, response.text
        (error,) = response.json()["detail"]
        assert error["loc"] == ["body", "results", 0, "tensors", 3, "shape"]
        assert str(MAX_TENSOR_ELEMENTS) in error["msg"]
    analysis_answers(api, honest[0]["run_id"], honest[1]["run_id"])


def test_stored_overflowing_shapes_do_not_break_the_analysis(api, monkeypatch):
    # Rows stored before the limit existed: let two poisoned runs in as an older server did.
    monkeypatch.setattr(schemas, "MAX_TENSOR_ELEMENTS", 2**70)
    poisons = [poisoned("node-c", "e" * 64), poisoned("node-d", "f" * 64, 1e-3)]
    for document in poisons:
        assert api.post_run(document).status_code == 201
    analysis_answers(api, poisons[0]["run_id"], poisons[1]["run_id"])


def test_stats_counts_are_bounded_by_the_element_limit(api):
    document = run_document()
    document["results"][0]["tensors"][0]["stats"]["nan"] = MAX_TENSOR_ELEMENTS + 1
    response = api.post_run(document)
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == [
        "body", "results", 0, "tensors", 0, "stats", "nan"]


def test_a_stored_overflowing_shape_counts_its_elements_exactly():
    # Rows stored before the limit may hold such a shape: the count never goes negative.
    fingerprint = AnalysisFingerprint(hash="f" * 64, dtype="float32",
                                      shape=(4611686018427387904, 3))
    assert fingerprint.count == 4611686018427387904 * 3


# -- time that cannot be forged -------------------------------------------------------

@pytest.mark.parametrize("field", ["started_at", "finished_at"])
def test_a_time_beyond_the_clock_skew_is_422_naming_it(make_api, field):
    api = make_api(max_clock_skew_s=3600)
    document = run_document()
    future = datetime.now(timezone.utc) + timedelta(hours=2)
    document["started_at"] = iso(future - timedelta(minutes=1))
    document["finished_at"] = iso(future)
    if field == "finished_at":
        document["started_at"] = iso(datetime.now(timezone.utc))
    else:
        document["finished_at"] = None
    response = api.post_run(document)
    assert response.status_code == 422, response.text
    (error,) = response.json()["detail"]
    assert error["loc"] == ["body", field]
    assert "NUMPARITY_MAX_CLOCK_SKEW_S" in error["msg"]
    year_9999 = run_document(started_at="9999-01-01T00:00:00Z")
    assert api.post_run(year_9999).status_code == 422
    assert stored_runs(api) == 0


def test_finished_before_started_is_422(api):
    document = run_document(started_at="2026-11-21T10:00:00Z")
    document["finished_at"] = "2026-11-21T09:00:00Z"
    response = api.post_run(document)
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "finished_at"]


def latest_run_ids(api) -> set[str]:
    with session_factory(get_engine(api.settings))() as session:
        return set(session.scalars(
            select(Run.run_id).join(Result, Result.run_pk == Run.id)
            .join(Latest, Latest.result_id == Result.id)).all())


@pytest.mark.parametrize("claimed", ["skew limit", "far past"])
def test_a_forged_start_does_not_freeze_the_latest_result(api, claimed):
    now = datetime.now(timezone.utc)
    forged_start = (now + timedelta(hours=23) if claimed == "skew limit"
                    else datetime(1971, 1, 1, tzinfo=timezone.utc))
    forged = run_document("victim", started_at=iso(forged_start), shift=0.5,
                          env_vars={"FORGED": "1"})
    assert api.post_run(forged).status_code == 201
    # Started after the forged run was received (a second on: iso() drops microseconds).
    honest = run_document("victim",
                          started_at=iso(datetime.now(timezone.utc) + timedelta(seconds=1)))
    assert api.post_run(honest).status_code == 201
    assert latest_run_ids(api) == {honest["run_id"]}
    nodes = api.client.get("/api/v1/nodes", headers=api.reader).json()["items"]
    (victim,) = [node for node in nodes if node["name"] == "victim"]
    assert victim["env_key"] == honest["environment"]["env_key"]


# -- content checked where it can be ---------------------------------------------------

def test_small_values_that_are_not_the_hash_are_422(api):
    document = run_document()
    output = document["results"][0]["tensors"][-1]
    raw = bytearray(base64.b64decode(output["values"]["data"]))
    raw[0] ^= 1
    output["values"]["data"] = base64.b64encode(bytes(raw)).decode()
    response = api.post_run(document)
    assert response.status_code == 422, response.text
    (error,) = response.json()["detail"]
    assert "'output'" in error["msg"] and "sha256" in error["msg"]
    assert stored_runs(api) == 0


def test_small_values_of_another_dtype_are_422(api):
    document = run_document()
    output = document["results"][0]["tensors"][-1]
    output["values"]["dtype"] = "int32"  # same byte length as float32
    response = api.post_run(document)
    assert response.status_code == 422
    assert "int32" in response.json()["detail"][0]["msg"]
    assert stored_runs(api) == 0
