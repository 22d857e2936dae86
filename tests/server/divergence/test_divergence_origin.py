"""GET /api/v1/divergence's origin ops (design §3.3.14): each pair of groups traced back
to the op where their numbers part, from the groups' representatives' op traces."""

from __future__ import annotations

from helpers.documents import run_document
from helpers.traces import cnn_trace, with_traces

CNN = ("cnn", "default")


def post(api, node, shift=0.0, *, traced=True, **trace_options):
    document = run_document(node, shift=shift)
    if traced:
        document = with_traces(document, {CNN: cnn_trace(shift, **trace_options)})
    response = api.post_run(document)
    assert response.status_code == 201, response.text


def divergence(api, **params):
    response = api.client.get("/api/v1/divergence", params={"workload": "cnn",
                                                            "variant": "default", **params},
                              headers=api.reader)
    assert response.status_code == 200, response.text
    return response.json()


def test_each_pair_of_groups_names_its_origin_op(api):
    post(api, "stock-1")
    post(api, "stock-2")
    post(api, "mkl", shift=1e-3, conv2_kernel="conv:Mkldnn")
    for params in ({}, {"tensor": "output"}):
        report = divergence(api, **params)
        assert [g["nodes"] for g in report["groups"]] == [["stock-1", "stock-2"], ["mkl"]]
        assert report["origin_note"] is None
        (pair,) = report["pairs"]
        origin = pair["origin"]
        assert pair["origin_note"] is None
        assert (origin["trace_a"], origin["count"]) == (cnn_trace()["hash"], 1)
        (first,) = origin["ops"]
        assert (first["op"], first["layer"], first["kernel_a"], first["kernel_b"]) == (
            "aten.convolution.default", "conv2", None, "conv:Mkldnn")
        assert (first["output"]["tensor"], first["output"]["verdict"]) == ("conv2",
                                                                           "divergent")


def test_a_group_whose_representative_has_no_trace_says_so(api):
    post(api, "stock-1")
    post(api, "stock-2")
    post(api, "untraced", shift=1e-3, traced=False)
    (pair,) = divergence(api)["pairs"]
    assert pair["origin"] is None
    assert pair["origin_note"] == ("group 2's representative (untraced) has no op trace: "
                                   "run the agent with --trace-ops")


def test_every_group_is_traced_back_against_the_baseline(api):
    """14 groups (the baseline of two nodes): each of the 13 others is compared with the
    baseline and traced back to its origin op; the pairs among the others (78) are in
    the full matrix, without origin ops unless asked for."""
    post(api, "stock-1")
    post(api, "stock-2")
    for i in range(1, 14):
        post(api, f"odd-{i:02d}", shift=i * 1e-3)
    report = divergence(api)
    assert len(report["groups"]) == 14 and report["groups"][0]["size"] == 2
    assert (report["pairs_mode"], report["pairs_total"], report["baseline"]) == (
        "baseline", 13, 1)
    assert report["origin_note"] is None
    assert [(p["a"], p["b"]) for p in report["pairs"]] == [(1, b) for b in range(2, 15)]
    assert all(p["origin"]["ops"][0]["layer"] == "conv2" for p in report["pairs"])

    matrix = divergence(api, pairs="all", pairs_limit=100)
    assert (matrix["pairs_mode"], matrix["pairs_total"], matrix["pairs_limit"]) == (
        "all", 91, 100)
    with_baseline = [p for p in matrix["pairs"] if p["a"] == 1]
    others = [p for p in matrix["pairs"] if p["a"] != 1]
    assert len(with_baseline) == 13 and len(others) == 78
    assert all(p["origin"] is not None for p in with_baseline)
    assert all(p["origin"] is None and p["origin_note"].startswith("not computed")
               for p in others)
    assert "only for the pairs with the baseline" in matrix["origin_note"]

    asked = divergence(api, pairs="all", pairs_limit=10, pairs_offset=20, pairs_origin="true")
    assert [(p["a"], p["b"]) for p in asked["pairs"]] == [
        (2, b) for b in range(10, 15)] + [(3, b) for b in range(4, 9)]
    assert asked["origin_note"] is None
    assert all(p["origin"]["ops"][0]["layer"] == "conv2" for p in asked["pairs"])
