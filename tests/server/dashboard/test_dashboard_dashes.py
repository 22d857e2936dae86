"""Pages that read right: every "—" (no value) on a page says why, in a tooltip (a
``title`` on it or around it) or in a footnote (``class="caption"``); a run marked as a
fault drill says so on the comparison page."""

from __future__ import annotations

import re
from html import unescape

import pytest
from helpers.documents import run_document
from helpers.pages import Dashes


def page(api, path):
    response = api.client.get(path, headers=api.reader)
    assert response.status_code == 200, response.text[:2000]
    return response.text


@pytest.fixture
def fleet(api):
    """Stock nodes, one far off, and a drill run; no fp64-reference run (so no fp64
    verdict), no agent version on one node."""
    documents = [run_document("node-1", run_id="r1", variants=("default", "strict")),
                 run_document("node-2", run_id="r2", variants=("default", "strict")),
                 run_document("far", run_id="rf", shift=1e-3, variants=("default", "strict"),
                              env_vars={"MKL_CBWR": "COMPATIBLE"}),
                 run_document("drilled", run_id="rd", shift=1e-3, drill=True,
                              variants=("default", "strict"))]
    del documents[1]["agent_version"]
    for document in documents:
        assert api.post_run(document).status_code == 201, document["run_id"]
    return api


@pytest.mark.parametrize("path", [
    "/", "/workloads", "/workloads/cnn", "/nodes/node-2", "/nodes/far",
    "/compare?run_a=r1&run_b=rf", "/compare?run_a=r2&run_b=rd", "/audit"])
def test_every_dash_on_a_page_says_why(fleet, path):
    assert Dashes(page(fleet, path)).unexplained == []


def test_the_fp64_columns_say_there_is_no_fp64_reference_run(fleet):
    html = page(fleet, "/workloads/cnn")
    titles = set(re.findall(r'<span class="none" title="([^"]+)">—</span>', html))
    assert "no fp64 verdict: no node has an ok fp64-reference result of cnn" in {
        unescape(t) for t in titles}


def test_the_comparison_page_says_a_run_is_a_drill(fleet):
    html = page(fleet, "/compare?run_a=r1&run_b=rd")
    (note,) = re.findall(r'<p class="note drill">(.*?)</p>', html, re.S)
    text = " ".join(unescape(re.sub(r"<[^>]+>", "", note)).split())
    assert text.startswith("Run b (drilled) is a fault drill (numparity-agent run "
                           "--fault-drill): one bit of one activation")
    assert 'class="note drill"' not in page(fleet, "/compare?run_a=r1&run_b=rf")


def test_the_comparison_names_the_one_flipped_bit_of_a_drill(api):
    """A drill's strict result: conv2 (whole values stored) has one bit of one element
    flipped, as `run --fault-drill` does; the page and /compare name it."""
    import numpy as np
    from helpers.documents import cnn_tensors, tensor_entry

    stock = run_document("node-1", run_id="s1", variants=("strict",))
    drilled = run_document("drilled", run_id="d1", variants=("strict",), drill=True)
    result = drilled["results"][0]
    conv2 = np.frombuffer(__import__("base64").b64decode(
        result["tensors"][1]["values"]["data"]), dtype="<f4").reshape(4, 64, 4, 4).copy()
    before = float(conv2.flat[37])
    conv2.reshape(-1).view(np.uint32)[37] ^= np.uint32(1 << 20)
    after = float(conv2.flat[37])
    result["tensors"][1] = tensor_entry("conv2", "layer", 1, conv2)
    assert cnn_tensors()[1]["hash"] != result["tensors"][1]["hash"]
    for document in (stock, drilled):
        assert api.post_run(document).status_code == 201
    compared = api.client.get("/api/v1/compare", params={"run_a": "s1", "run_b": "d1"},
                              headers=api.reader).json()
    (pair,) = [p for p in compared["pairs"] if p["compared"]]
    assert pair["first_divergent_layer"]["name"] == "conv2"
    assert pair["first_divergent_layer"]["bit_flip"] == {
        "index": 37, "bit": 20, "reference": before, "candidate": after}
    html = page(api, "/compare?run_a=s1&run_b=d1")
    assert (f"one flipped bit: element 37, bit 20, {before} → {after}"
            in unescape(html))
    assert 'class="note drill"' in html
