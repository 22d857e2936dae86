"""Suites are compared apart: a `large` run's `cnn` is another workload than a `standard`
run's `cnn`, in /divergence and in /audit (design §2.2)."""

from __future__ import annotations

from typing import Any

import pytest
from helpers.documents import audit_document, run_document

LARGE_INPUTS = "in-" + "7" * 61


def large(document: dict[str, Any]) -> dict[str, Any]:
    """The same run in the large suite, with other inputs (another definition)."""
    for result in document["results"]:
        result["suite"] = "large"
        if result["status"] == "ok":
            result["input_hash"] = LARGE_INPUTS
    return document


@pytest.fixture
def fleet(api):
    documents = [
        run_document("stock-1"), run_document("stock-2"),
        large(run_document("big-1", shift=1e-3)), large(run_document("big-2", shift=1e-3)),
        large(run_document("big-3", shift=2e-3)),
    ]
    for document in documents:
        assert api.post_run(document).status_code == 201
    return api


def divergence(api, **params):
    response = api.client.get("/api/v1/divergence", params=params, headers=api.reader)
    assert response.status_code == 200, response.text
    return response.json()


def test_divergence_groups_each_suite_alone(fleet):
    standard = divergence(fleet, workload="cnn", variant="default")
    assert standard["key"]["suite"] == "standard"
    assert [g["nodes"] for g in standard["groups"]] == [["stock-1", "stock-2"]]
    assert standard["excluded"] == [] and standard["pairs"] == []
    big = divergence(fleet, workload="cnn", variant="default", suite="large")
    assert big["key"]["suite"] == "large"
    assert [g["nodes"] for g in big["groups"]] == [["big-1", "big-2"], ["big-3"]]
    assert big["excluded"] == []


def test_the_audit_keeps_suites_apart(api):
    """Three standard peers and one node whose only strict results are the large suite's,
    other inputs and other answers in the same environment: had the audit mixed suites,
    that node would be a suspect with broken inputs."""
    documents = [*(audit_document(f"peer-{i}", 2) for i in (1, 2, 3)),
                 large(audit_document("big", 3, shift=1e-3)),
                 large(audit_document("big", 2, shift=1e-3)),
                 # The control: the same difference in the standard suite is found.
                 audit_document("broken", 2, input_hash="in-" + "1" * 61)]
    for document in documents:
        assert api.post_run(document).status_code == 201
    response = api.client.get("/api/v1/audit", headers=api.reader)
    assert response.status_code == 200, response.text
    report = response.json()
    assert [row["node"] for row in report["broken_inputs"]] == ["broken", "broken"]
    assert {row["suite"] for row in report["broken_inputs"]} == {"standard"}
    assert "big" not in {entry["node"] for entry in report["suspects"]}
    assert "big" not in {entry["node"] for entry in report["nondeterministic"]}
