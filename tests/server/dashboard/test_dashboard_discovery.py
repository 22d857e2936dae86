"""The dashboard says what exists and which tensor it shows: the workloads page (the
fleet's suites, workloads, variants and tensors, as GET /api/v1/suites), the workload
page's tensor picker (which tensor, and why) and an unknown tensor as a 404 page naming
the tensors there are."""

from __future__ import annotations

import copy
import re
from html import unescape

import pytest
from helpers.documents import run_document


def page(api, path, status=200):
    response = api.client.get(path, headers=api.reader)
    assert response.status_code == status, response.text[:2000]
    assert response.headers["content-type"].startswith("text/html")
    return response.text


def text(html):
    return " ".join(unescape(re.sub(r"<[^>]+>", "", html)).split())


def with_probes(document):
    """A `probes`-like result: four tensors of kind probe, none named output."""
    probes = copy.deepcopy(next(r for r in document["results"] if r["status"] == "ok"))
    probes["workload"] = "probes"
    for tensor, name in zip(probes["tensors"], ("sum_long", "matmul_large_k", "softmax",
                                                "exp_log"), strict=True):
        tensor.update(name=name, kind="probe")
    document["results"].append(probes)
    return document


@pytest.fixture
def fleet(api):
    for node in ("node-1", "node-2"):
        assert api.post_run(with_probes(run_document(node))).status_code == 201
    return api


def test_the_workloads_page_lists_what_the_fleet_ran_and_links_each_workload(fleet):
    html = page(fleet, "/workloads")
    rows = re.findall(r'<tr data-workload="([^"]+)">(.*?)</tr>', html, re.S)
    assert [name for name, _ in rows] == ["standard/cnn", "standard/probes"]
    cnn, probes = (text(row) for _, row in rows)
    assert 'href="/workloads/cnn?suite=standard"' in rows[0][1]
    assert "default" in cnn and "tf32" in cnn and "conv1 (layer)" in cnn
    assert "output (output)" in cnn
    assert "sum_long (probe)" in probes
    # The same list as the API, and a way to it.
    assert 'href="/api/v1/suites"' in html
    # Every page's navigation leads there, and the fleet page says so.
    assert '<a href="/workloads">Workloads</a>' in page(fleet, "/")


def test_the_tensor_picker_says_which_tensor_it_shows_and_why(fleet):
    cnn = text(page(fleet, "/workloads/cnn"))
    assert "Showing tensor output (the workload's output tensor, chosen by default)." in cnn
    probes = text(page(fleet, "/workloads/probes"))
    assert ("Showing tensor sum_long (probes has no tensor named output nor any of kind "
            "output, so its first tensor, chosen by default).") in probes
    chosen = text(page(fleet, "/workloads/probes?tensor=softmax"))
    assert "Showing tensor softmax (as asked)." in chosen
    assert "0 groups" not in chosen and "1 group of 2 nodes" in chosen


def test_an_unknown_tensor_is_a_404_page_naming_the_tensors_there_are(fleet):
    html = page(fleet, "/workloads/cnn?tensor=zzz", 404)
    assert [unescape(m) for m in re.findall(r'<p class="error">(.*?)</p>', html, re.S)] == [
        "workload 'cnn' (suite 'standard') has no tensor 'zzz'; its tensors: conv1, conv2, "
        "fc1, output"]
    assert "nothing to explain" not in html
    assert "<h1>Not found</h1>" in html


def test_divergence_without_a_tensor_groups_whole_results_of_a_workload_without_output(fleet):
    response = fleet.client.get("/api/v1/divergence", params={
        "workload": "probes", "variant": "default"}, headers=fleet.reader)
    assert response.status_code == 200, response.text
    report = response.json()
    assert report["tensor"] is None and [g["nodes"] for g in report["groups"]] == [
        ["node-1", "node-2"]]
    missing = fleet.client.get("/api/v1/divergence", params={
        "workload": "probes", "variant": "default", "tensor": "output"}, headers=fleet.reader)
    assert missing.status_code == 404
    assert missing.json()["detail"] == ("no result of 'probes' under 'default' has a tensor "
                                        "'output'; its tensors: sum_long, matmul_large_k, "
                                        "softmax, exp_log")
