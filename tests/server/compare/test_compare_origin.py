"""GET /api/v1/compare's origin ops (design §3.3.14): each result pair of two traced
runs names the op where their numbers part, its layer and the error of its output."""

from __future__ import annotations

import gzip
import json

import httpx
import numpy as np
from helpers.documents import cnn_tensors, run_document
from helpers.traces import cnn_trace, with_traces
from sqlalchemy import event

from numparity_server.compare.schemas import CompareOut

CNN = ("cnn", "default")
HINT = "run the agent with --trace-ops"


def upload(api, *documents):
    for document in documents:
        response = api.post_run(document)
        assert response.status_code == 201, response.text


def cnn_pair(api, **params):
    response = api.client.get("/api/v1/compare", params=params, headers=api.reader)
    assert response.status_code == 200, response.text
    CompareOut.model_validate(response.json())
    pairs = {(p["workload"], p["variant"]): p for p in response.json()["pairs"]}
    return pairs[CNN], pairs[("cnn", "tf32")]


def traced(node, run_id, shift=0.0, **trace_options):
    return with_traces(run_document(node, run_id=run_id, shift=shift),
                       {CNN: cnn_trace(shift, **trace_options)})


def conv2_max_abs(shift: float) -> float:
    """conv2's largest difference, computed here from the documents' own arrays."""
    import base64

    def values(tensors):
        (conv2,) = [t for t in tensors if t["name"] == "conv2"]
        return np.frombuffer(base64.b64decode(conv2["values"]["data"]), "<f4").astype(float)

    return float(np.max(np.abs(values(cnn_tensors(shift)) - values(cnn_tensors()))))


def test_two_traced_runs_name_the_origin_op_its_layer_and_its_error(api):
    upload(api, traced("node-1", "a-1"), traced("node-2", "b-1", shift=1e-3))
    pair, skipped = cnn_pair(api, run_a="a-1", run_b="b-1")

    origin = pair["origin"]
    assert pair["origin_note"] is None
    assert (origin["trace_a"], origin["trace_b"]) == (cnn_trace()["hash"],
                                                      cnn_trace(1e-3)["hash"])
    assert origin["same_sequence"] is True and origin["parting"] is None
    assert (origin["ops_a"], origin["ops_b"], origin["aligned"], origin["count"]) == (
        6, 6, 6, 1)
    (first,) = origin["ops"]
    assert {k: first[k] for k in ("seq_a", "seq_b", "op", "module", "phase", "layer",
                                  "tensor")} == {
        "seq_a": 2, "seq_b": 2, "op": "aten.convolution.default", "module": "conv2",
        "phase": "forward", "layer": "conv2", "tensor": "conv2"}
    assert first["inputs"] == [{"dtype": "float32", "shape": [4, 32, 12, 12]},
                               {"dtype": "float32", "shape": [64, 32, 5, 5]},
                               {"dtype": "float32", "shape": [64]}]
    assert first["outputs"] == [{"dtype": "float32", "shape": [4, 64, 4, 4]}]
    output = first["output"]
    assert (output["tensor"], output["verdict"], output["basis"]) == (
        "conv2", "divergent", "values")
    assert output["metrics"]["max_abs"] == conv2_max_abs(1e-3)
    # The skipped results have nothing to trace, and nothing to say about it.
    assert skipped["origin"] is None and skipped["origin_note"] is None


def test_a_side_without_a_trace_says_so(api):
    upload(api, traced("node-1", "a-1"), run_document("node-2", run_id="b-1", shift=1e-3),
           run_document("node-3", run_id="c-1"))
    pair, _ = cnn_pair(api, run_a="a-1", run_b="b-1")
    assert pair["origin"] is None
    assert pair["origin_note"] == f"run b's result has no op trace: {HINT}"
    pair, _ = cnn_pair(api, run_a="c-1", run_b="b-1")
    assert pair["origin_note"] == (f"run a's result and run b's result have no op trace: "
                                   f"{HINT}")


def test_sequences_that_part_name_both_ops(api):
    """Run b's conv2 runs another algorithm (another op, two more steps): the sequences
    part at conv2, both ops named; nothing after it read the same bits."""
    upload(api, traced("node-1", "a-1"),
           traced("node-2", "b-1", shift=1e-3, conv2_op="aten.mkldnn_convolution.default",
                  extra_forward_ops=2))
    pair, _ = cnn_pair(api, run_a="a-1", run_b="b-1")
    origin = pair["origin"]
    assert origin["same_sequence"] is False
    assert (origin["ops_a"], origin["ops_b"]) == (6, 8)
    parting = origin["parting"]
    assert (parting["seq_a"], parting["seq_b"], parting["a"], parting["b"]) == (
        2, 2, "aten.convolution.default", "aten.mkldnn_convolution.default")
    assert (parting["module_a"], parting["module_b"]) == ("conv2", "conv2")
    assert origin["count"] == 0 and origin["ops"] == []


def test_identical_traced_runs_have_no_origin(api):
    upload(api, traced("node-1", "a-1"), traced("node-2", "b-1"))
    pair, _ = cnn_pair(api, run_a="a-1", run_b="b-1")
    assert pair["origin"]["count"] == 0 and pair["origin"]["same_sequence"] is True


def count_statements(api, **params):
    engine = api.client.app.state.engine
    statements = []

    def count(_conn, _cursor, statement, *_args):
        statements.append(statement)

    event.listen(engine, "before_cursor_execute", count)
    try:
        response = api.client.get("/api/v1/compare", params=params, headers=api.reader)
        assert response.status_code == 200, response.text
    finally:
        event.remove(engine, "before_cursor_execute", count)
    return len(statements), response.json()


def test_statements_do_not_grow_with_traced_results_once_kept(api):
    """Each pair of traces is aligned once (its origin ops kept by content, as its
    summary): asked again, a fixed number of statements whatever the traced results."""
    def traced_run(node, run_id, shift, workloads, variants):
        document = run_document(node, run_id=run_id, shift=shift, workloads=workloads,
                                variants=variants)
        return with_traces(document, {(w, v): cnn_trace(shift, conv2_kernel=f"{w}/{v}")
                                      for w in workloads for v in variants})

    small = {"workloads": ("cnn",), "variants": ("default",)}
    big = {"workloads": ("cnn", "mlp", "vit"), "variants": ("default", "strict")}
    upload(api, traced_run("node-1", "small-a", 0.0, **small),
           traced_run("node-2", "small-b", 1e-3, **small),
           traced_run("node-1", "big-a", 0.0, **big),
           traced_run("node-2", "big-b", 1e-3, **big))
    for run_a, run_b in (("small-a", "small-b"), ("big-a", "big-b")):
        count_statements(api, run_a=run_a, run_b=run_b)
    small_count, _ = count_statements(api, run_a="small-a", run_b="small-b")
    big_count, report = count_statements(api, run_a="big-a", run_b="big-b")
    assert sum(1 for p in report["pairs"] if p["origin"] and p["origin"]["count"]) == 6
    assert big_count == small_count


def test_a_live_server_takes_traced_gzip_uploads_and_names_the_origin(live_server):
    """Through real HTTP: gzip uploads with trace bodies, a second upload that refers to
    the stored trace without its body, and the comparison."""
    agent, reader = live_server.headers("agent"), live_server.headers("reader")
    with httpx.Client(base_url=live_server.base_url, timeout=30) as client:
        for document in (traced("node-1", "a-1"), traced("node-2", "b-1", shift=1e-3),
                         with_traces(run_document("node-3", run_id="c-1"),
                                     {CNN: cnn_trace()}, send_bodies=False)):
            response = client.post("/api/v1/runs",
                                   content=gzip.compress(json.dumps(document).encode()),
                                   headers={**agent, "Content-Encoding": "gzip",
                                            "Content-Type": "application/json"})
            assert response.status_code == 201, response.text
        response = client.get("/api/v1/compare", params={"run_a": "c-1", "run_b": "b-1"},
                              headers=reader)
    assert response.status_code == 200, response.text
    (pair,) = [p for p in response.json()["pairs"] if p["variant"] == "default"]
    assert pair["origin"]["ops"][0]["layer"] == "conv2"
