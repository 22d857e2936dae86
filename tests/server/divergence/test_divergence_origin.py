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


def test_with_more_than_12_groups_only_the_pairs_with_the_largest_have_origins(api):
    """14 groups (the largest of two nodes): every group against group 1 is traced back,
    the 78 pairs among the others are not, and the answer says so."""
    post(api, "stock-1")
    post(api, "stock-2")
    for i in range(1, 14):
        post(api, f"odd-{i:02d}", shift=i * 1e-3)
    report = divergence(api)
    assert len(report["groups"]) == 14 and report["groups"][0]["size"] == 2
    assert "14 groups, more than 12" in report["origin_note"]
    with_first = [p for p in report["pairs"] if p["a"] == 1]
    others = [p for p in report["pairs"] if p["a"] != 1]
    assert len(with_first) == 13 and len(others) == 78
    assert all(p["origin"]["ops"][0]["layer"] == "conv2" for p in with_first)
    assert all(p["origin"] is None and "only for the pairs with group 1" in p["origin_note"]
               for p in others)


def test_twelve_groups_all_have_origins(api):
    post(api, "stock-1")
    for i in range(1, 12):
        post(api, f"odd-{i:02d}", shift=i * 1e-3)
    report = divergence(api)
    assert len(report["groups"]) == 12 and report["origin_note"] is None
    assert len(report["pairs"]) == 66
    assert all(p["origin"] is not None for p in report["pairs"])
