"""Reads bounded by their page (issue 30): uploads within every limit do not make a
/compare slow or huge. Results that all point at one large manifest are listed a page of
tensor rows at a time with the summary over all of them (finding 2); two traces are
aligned once, holding no pooled connection (finding 1); whole values are compared a
chunk at a time (finding 3)."""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import tracemalloc

import numpy as np
import pytest
from helpers.documents import run_document, tensor_entry
from helpers.traces import cnn_trace, with_traces
from sqlalchemy import delete, event

from numparity_server.analysis import compare_manifests, fingerprint_from_wire
from numparity_server.analysis import origin as origin_module
from numparity_server.analysis import result_pair as result_pair_module
from numparity_server.compare.schemas import CompareOut
from numparity_server.models import KeptComparison

TENSORS = 300
RESULTS = 10


def manifest_hash(tensors: list[dict]) -> str:
    """The contract's manifest hash, computed independently of the server's code."""
    triples = [[t["name"], t["kind"], t["hash"]] for t in sorted(tensors, key=lambda t: t["order"])]
    return hashlib.sha256(json.dumps(triples, separators=(",", ":")).encode()).hexdigest()


def with_values(entry: dict, array: np.ndarray) -> dict:
    entry["values"] = {"dtype": "float32",
                       "data": base64.b64encode(array.astype("<f4").tobytes()).decode()}
    return entry


def wide_run(node: str, run_id: str, shift: float, *,
             values: bool = False) -> tuple[dict, list[dict]]:
    """A run whose RESULTS results all hold one manifest of TENSORS tensors: the first
    carries them (with their whole ``values``), the others name the manifest by its hash
    (as an agent may)."""
    rng = np.random.default_rng(7)
    arrays = [rng.standard_normal(8).astype(np.float32) * (1 + shift * (i % 2))
              for i in range(TENSORS)]
    tensors = [tensor_entry(f"t{i:03d}", "layer" if i % 3 else "output", i, array)
               for i, array in enumerate(arrays)]
    if values:
        tensors = [with_values(entry, array) for entry, array in zip(tensors, arrays,
                                                                     strict=True)]
    document = run_document(node, run_id=run_id)
    template = document["results"][0]
    results = [{**copy.deepcopy(template), "workload": f"wide-{k}", "tensors": tensors}
               if k == 0 else
               {**{key: value for key, value in template.items() if key != "tensors"},
                "workload": f"wide-{k}", "manifest": manifest_hash(tensors)}
               for k in range(RESULTS)]
    document["results"] = results
    return document, tensors


def test_compare_lists_tensor_rows_a_page_at_a_time_with_summaries_over_all(api):
    a, tensors_a = wide_run("node-a", "wide-a", 0.0)
    b, tensors_b = wide_run("node-b", "wide-b", 1e-3)
    for document in (a, b):
        assert api.post_run(document).status_code == 201
    response = api.client.get("/api/v1/compare", headers=api.reader,
                              params={"run_a": "wide-a", "run_b": "wide-b"})
    assert response.status_code == 200, response.text
    first = CompareOut.model_validate(response.json())
    # The default page: 50 rows, whatever was uploaded (before: every one of 3,000).
    assert sum(len(pair.tensors) for pair in first.pairs) == 50
    assert (first.limit, first.offset, first.tensors_total) == (50, 0, RESULTS * TENSORS)
    assert len(response.content) < 256 * 1024
    # The oracle: the analysis' own comparison of the two manifests from the documents.
    fingerprints = {t["hash"]: fingerprint_from_wire(t) for t in (*tensors_a, *tensors_b)}
    expected = compare_manifests([(t["name"], t["kind"], t["hash"]) for t in tensors_b],
                                 [(t["name"], t["kind"], t["hash"]) for t in tensors_a],
                                 fingerprints)
    verdicts = {v: sum(row["verdict"] == v for row in expected)
                for v in ("identical", "equivalent", "divergent", "nonfinite")}
    for pair in first.pairs:
        assert pair.summary is not None and pair.summary.tensors == TENSORS
        assert pair.summary.verdicts == verdicts
        assert pair.summary.outputs_total == TENSORS // 3
        assert len(pair.summary.outputs) == 50
    # Every page of 500 rows, walked, is every row once, in order.
    rows = []
    for offset in range(0, RESULTS * TENSORS, 500):
        page = api.client.get("/api/v1/compare", headers=api.reader, params={
            "run_a": "wide-a", "run_b": "wide-b", "limit": 500, "offset": offset}).json()
        assert sum(len(pair["tensors"]) for pair in page["pairs"]) == 500
        rows += [(pair["workload"], row["name"], row["verdict"], row["metrics"])
                 for pair in page["pairs"] for row in pair["tensors"]]
    assert rows == [(f"wide-{k}", row["name"], row["verdict"], row["metrics"])
                    for k in range(RESULTS) for row in expected]
    assert api.client.get("/api/v1/compare", headers=api.reader, params={
        "run_a": "wide-a", "run_b": "wide-b", "limit": 501}).status_code == 422


def expected_verdicts(tensors_a: list[dict], tensors_b: list[dict]) -> list[tuple]:
    """The oracle: the analysis' own comparison of the two manifests from the documents,
    every fingerprint at hand."""
    fingerprints = {t["hash"]: fingerprint_from_wire(t) for t in (*tensors_a, *tensors_b)}
    rows = compare_manifests([(t["name"], t["kind"], t["hash"]) for t in tensors_b],
                             [(t["name"], t["kind"], t["hash"]) for t in tensors_a],
                             fingerprints)
    return [(row["name"], row["verdict"], row["basis"], row["metrics"]) for row in rows]


# What a tensor compared from its whole values costs a part: its elements and the
# comparison's fixed cost (result_pair._WITHOUT_VALUES_COST).
DIFFERING_COST = 8 + 1024


@pytest.mark.parametrize(("part_elements", "parts"), [
    # Parts of 256 tensors: 300 tensors are two.
    (None, 2),
    # Parts of at most 50 differing tensors' whole values: the odd tensors differ (150),
    # the even are identical and cost nothing, so [0, 101), [101, 201), [201, 300).
    (50 * DIFFERING_COST, 3),
])
def test_a_wide_pair_is_computed_a_part_at_a_time_over_several_asks(
        make_api, monkeypatch, part_elements, parts):
    """Asked with no computing time to spare, /compare computes one part of a pair's
    tensors per request (at most 256 tensors, and a bounded number of elements compared
    from whole values) and answers the rest as pending; the asks that follow go on
    where it stopped, each part is computed once, and the answer that completes is the
    oracle's (before: the first ask computed all the pair's tensors, 2-7 s for 4,096)."""
    if part_elements is not None:
        monkeypatch.setattr(result_pair_module, "PART_ELEMENTS", part_elements)
    api = make_api(compute_seconds=0.0)
    (a, tensors_a), (b, tensors_b) = (wide_run("node-a", "wide-a", 0.0, values=True),
                                      wide_run("node-b", "wide-b", 1e-3, values=True))
    for document in (a, b):
        assert api.post_run(document).status_code == 201
    computations = api.client.app.state.computations

    def ask(**params):
        response = api.client.get("/api/v1/compare", headers=api.reader, params={
            "run_a": "wide-a", "run_b": "wide-b", "limit": 500, **params})
        assert response.status_code == 200, response.text
        return response.json()

    answers = [ask()]
    while answers[-1]["pending"] and len(answers) <= parts:
        answers.append(ask())
    assert len(answers) == parts
    for answer in answers[:-1]:
        assert answer["pending"] == RESULTS
        assert all(pair["pending"] and pair["summary"] is None for pair in answer["pairs"])
    assert computations.computed == parts
    last = answers[-1]
    assert last["pending"] == 0 and last["tensors_total"] == RESULTS * TENSORS
    expected = expected_verdicts(tensors_a, tensors_b)
    # Identical tensors by their hash, the others measured from their whole values.
    assert {row[2] for row in expected} == {"hash", "values"}
    rows = [(row["name"], row["verdict"], row["basis"], row["metrics"])
            for row in last["pairs"][0]["tensors"]]
    assert rows == expected[:500]
    # Asked again for a page across two pairs, nothing is computed: the summary and the
    # parts are kept, and read back in the order they were computed in.
    again = ask(offset=TENSORS + 100)
    assert again["pending"] == 0 and computations.computed == parts
    rows = [(row["name"], row["verdict"], row["basis"], row["metrics"])
            for pair in again["pairs"] for row in pair["tensors"]]
    assert rows == expected[100:] + expected[:500 - (TENSORS - 100)]
    # Parts a retention pass dropped are computed again, those of the page only.
    with api.client.app.state.engine.begin() as connection:
        connection.execute(delete(KeptComparison).where(KeptComparison.kind == "rows"))
    page = ask(limit=50)
    assert [(row["name"], row["verdict"], row["basis"], row["metrics"])
            for row in page["pairs"][0]["tensors"]] == expected[:50]
    assert computations.computed == parts + 1


def test_comparing_small_tensors_reads_their_values_with_their_fingerprints(api):
    """Whole values of a few KiB come with the rest of their fingerprint: the first
    /compare of two results of TENSORS tensors makes a few dozen queries, not two per
    tensor (before: 8,192 for 4,096 tensors, seconds on either database)."""
    for document in (wide_run("node-a", "wide-a", 0.0, values=True)[0],
                     wide_run("node-b", "wide-b", 1e-3, values=True)[0]):
        assert api.post_run(document).status_code == 201
    statements: list[str] = []
    engine = api.client.app.state.engine

    def count(_conn, _cursor, statement, *_args):
        statements.append(statement)

    event.listen(engine, "before_cursor_execute", count)
    try:
        response = api.client.get("/api/v1/compare", headers=api.reader,
                                  params={"run_a": "wide-a", "run_b": "wide-b"})
    finally:
        event.remove(engine, "before_cursor_execute", count)
    assert response.status_code == 200 and response.json()["pending"] == 0
    rows = response.json()["pairs"][0]["tensors"]
    assert {row["basis"] for row in rows} == {"hash", "values"}
    assert len(statements) < 60, len(statements)


def test_the_compare_page_shows_a_page_of_rows(api):
    for document in (wide_run("node-a", "wide-a", 0.0)[0], wide_run("node-b", "wide-b", 1e-3)[0]):
        assert api.post_run(document).status_code == 201
    page = api.client.get("/compare", headers=api.reader,
                          params={"run_a": "wide-a", "run_b": "wide-b", "limit": 100})
    assert page.status_code == 200
    assert page.text.count('class="tensor-row"') == 100
    assert "offset=100" in page.text  # the next page
    assert len(page.content) < 2 * 1024 * 1024


CNN = ("cnn", "default")


def traced(node, run_id, shift=0.0):
    return with_traces(run_document(node, run_id=run_id, shift=shift),
                       {CNN: cnn_trace(shift)})


def test_a_pair_of_traces_is_aligned_once_holding_no_connection(api, monkeypatch):
    """/compare asked twice and /divergence once align the two traces once (kept by
    content, shared), and the alignment runs with every pooled connection back in the
    pool (before: one per asker, held while it computed: 45 readers, 25 pool timeouts)."""
    for document in (traced("node-1", "a-1"), traced("node-2", "b-1", 1e-3)):
        assert api.post_run(document).status_code == 201
    pool = api.client.app.state.engine.pool
    held: list[int] = []
    align = origin_module.align

    def counting(*args, **kwargs):
        held.append(pool.checkedout())
        return align(*args, **kwargs)

    monkeypatch.setattr(origin_module, "align", counting)
    answers = [api.client.get("/api/v1/compare", headers=api.reader,
                              params={"run_a": "a-1", "run_b": "b-1", "workload": "cnn",
                                      "variant": "default"}).json() for _ in range(2)]
    assert answers[0] == answers[1]
    (pair,) = answers[0]["pairs"]
    assert pair["origin"]["count"] == 1 and pair["origin"]["aligned_up_to"] is None
    divergence = api.client.get("/api/v1/divergence", headers=api.reader,
                                params={"workload": "cnn", "variant": "default"}).json()
    assert divergence["pairs"][0]["origin"] == pair["origin"]
    assert held == [0]


@pytest.mark.parametrize("elements", [1 << 22])
def test_whole_values_are_compared_a_chunk_at_a_time(make_api, elements):
    """Two tensors of 4 million elements with their whole values: /compare measures them
    from the values (max abs exactly) and holds a chunk of each, not the arrays (before:
    both decoded whole, 16 MiB each)."""
    api = make_api(token_bytes_per_s=0)  # two 21 MiB uploads at once
    base = np.zeros(elements, dtype=np.float32)
    base[::1000] = 1.0
    other = base.copy()
    other[-1] = 0.5  # one element differs, in the last chunk
    documents = []
    for node, run_id, array in (("node-a", "big-a", base), ("node-b", "big-b", other)):
        entry = tensor_entry("output", "output", 0, array)
        entry["values"] = {"dtype": "float32",
                           "data": base64.b64encode(array.astype("<f4").tobytes()).decode()}
        document = run_document(node, run_id=run_id)
        document["results"] = [{**document["results"][0], "tensors": [entry]}]
        documents.append(document)
    for document in documents:
        response = api.post_run(document)
        assert response.status_code == 201, response.text
    tracemalloc.start()
    try:
        response = api.client.get("/api/v1/compare", headers=api.reader,
                                  params={"run_a": "big-a", "run_b": "big-b"})
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert response.status_code == 200, response.text
    (row,) = response.json()["pairs"][0]["tensors"]
    assert (row["verdict"], row["basis"]) == ("divergent", "values")
    assert row["metrics"]["max_abs"] == 0.5
    assert row["metrics"]["mismatch_fraction"] == 1 / elements
    # A chunk is 64 Ki elements: each of the scan's two threads holds ~3.5 MiB of float64
    # scratch for one, whatever the tensor's size; one whole array is 16 MiB.
    assert peak < 12 * 1024 * 1024, peak


