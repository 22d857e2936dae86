"""One consensus rule: /divergence, /audit, /metrics and the fleet page name the same
usual answer and the same broken inputs (analysis.consensus), ties and all."""

from __future__ import annotations

import re

import pytest
from helpers.documents import run_document
from prometheus_client.parser import text_string_to_metric_families

OTHER_INPUTS = "in-" + "1" * 61


@pytest.fixture
def tied_fleet(make_api):
    api = make_api(metrics_cache_seconds=0)
    documents = [
        # Two answers with two nodes each: the tie goes to the first node name (a-1).
        run_document("b-1", shift=1e-3), run_document("b-2", shift=1e-3),
        run_document("a-2"), run_document("a-1"),
        # Other input bytes: broken inputs, not a third answer, whatever it computed.
        run_document("c-broken", input_hash=OTHER_INPUTS, shift=5e-3),
        run_document("c-broken-2", input_hash=OTHER_INPUTS, shift=5e-3),
        # A drill with an answer of its own.
        run_document("e-drill", shift=2e-3, drill=True),
    ]
    # An agent that could not hash its inputs: differs from nothing, votes for nothing.
    unhashed = run_document("d-unhashed")
    for result in unhashed["results"]:
        result.pop("input_hash", None)
        result.pop("param_hash", None)
    for document in [*documents, unhashed]:
        assert api.post_run(document).status_code == 201, document["node"]
    return api


def test_every_view_names_the_same_usual_answer_and_broken_inputs(tied_fleet):
    api = tied_fleet
    divergence = api.client.get("/api/v1/divergence", headers=api.reader,
                                params={"workload": "cnn", "variant": "default",
                                        "tensor": "output"}).json()
    groups = divergence["groups"]
    assert groups[0]["nodes"] == ["a-1", "a-2", "d-unhashed"]  # the usual answer
    assert {e["node"] for e in divergence["excluded"]} == {"c-broken", "c-broken-2"}

    audit = api.client.get("/api/v1/audit", headers=api.reader).json()
    assert {row["node"] for row in audit["broken_inputs"]} == {"c-broken", "c-broken-2"}

    scrape = api.client.get("/metrics", headers=api.reader).text
    (family,) = [f for f in text_string_to_metric_families(scrape)
                 if f.name == "numparity_groups"]
    (sample,) = [s for s in family.samples if s.labels["workload"] == "cnn"
                 and s.labels["variant"] == "default"]
    whole = api.client.get("/api/v1/divergence", headers=api.reader,
                           params={"workload": "cnn", "variant": "default"}).json()
    assert whole["groups"][0]["nodes"] == ["a-1", "a-2", "d-unhashed"]
    assert sample.value == len(whole["groups"]) == 3  # a-1's, b-1's and the drill's

    html = api.client.get("/", headers=api.reader).text
    starred = [row.split('"', 1)[0] for row in html.split('<tr data-node="')[1:]
               if re.search(r"★</a>", row)]
    assert starred == ["a-1"]  # the fleet page's baseline is the usual answer's first node


def test_the_tie_break_is_the_first_node_name_not_the_upload_order(make_api):
    api = make_api()
    for document in (run_document("z-1", shift=1e-3), run_document("m-1")):
        assert api.post_run(document).status_code == 201
    divergence = api.client.get("/api/v1/divergence", headers=api.reader,
                                params={"workload": "cnn", "variant": "default",
                                        "tensor": "output"}).json()
    assert divergence["groups"][0]["nodes"] == ["m-1"]
