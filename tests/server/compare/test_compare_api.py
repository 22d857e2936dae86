"""GET /api/v1/compare: two runs, result by result and tensor by tensor."""

from __future__ import annotations

import base64

import numpy as np
import pytest
from helpers.documents import rekey, run_document
from sqlalchemy import event

from numparity_server.compare.schemas import COMPARE_EXAMPLE, CompareOut

# torch.testing.assert_close's float32 default (design §3.3).
RTOL, ATOL = 1.3e-6, 1e-5


def upload(api, *documents):
    for document in documents:
        response = api.post_run(document)
        assert response.status_code == 201, response.text


def get_compare(api, **params):
    return api.client.get("/api/v1/compare", params=params, headers=api.reader)


def compare_ok(api, **params):
    response = get_compare(api, **params)
    assert response.status_code == 200, response.text
    return response.json()


def pair_of(report, workload="cnn", variant="default"):
    (pair,) = [p for p in report["pairs"]
               if (p["workload"], p["variant"]) == (workload, variant)]
    return pair


def tensor_values(document, name, workload="cnn", variant="default"):
    """A tensor's uploaded values as float64, decoded here from the wire."""
    (result,) = [r for r in document["results"]
                 if (r["workload"], r["variant"]) == (workload, variant)]
    (tensor,) = [t for t in result["tensors"] if t["name"] == name]
    raw = base64.b64decode(tensor["values"]["data"])
    return np.frombuffer(raw, dtype="<f4").astype(np.float64)


def test_identical_runs_are_identical_tensor_by_tensor(api):
    upload(api, run_document("node-1", run_id="a-1"), run_document("node-2", run_id="b-1"))
    report = compare_ok(api, run_a="a-1", run_b="b-1")

    assert (report["run_a"]["run_id"], report["run_a"]["node"]) == ("a-1", "node-1")
    assert (report["run_b"]["run_id"], report["run_b"]["node"]) == ("b-1", "node-2")
    assert report["run_a"]["env_key"] == report["run_b"]["env_key"]
    assert report["run_a"]["started_at"].startswith("2026-11-21T10:00:00")
    assert report["run_a"]["drill"] is False
    assert report["environment"] == []
    assert report["only_in_a"] == [] and report["only_in_b"] == []

    pair = pair_of(report)
    assert pair["compared"] is True and pair["device"] == "cpu"
    assert [(t["name"], t["kind"], t["verdict"]) for t in pair["tensors"]] == [
        ("conv1", "layer", "identical"), ("conv2", "layer", "identical"),
        ("fc1", "layer", "identical"), ("output", "output", "identical")]
    assert all(t["metrics"]["max_abs"] == 0.0 for t in pair["tensors"])
    assert pair["summary"]["verdicts"] == {"identical": 4, "equivalent": 0, "divergent": 0,
                                           "nonfinite": 0}
    assert pair["summary"]["output_verdict"] == "identical"
    assert pair["first_divergent_layer"] is None
    assert pair["largest_jump"] is None
    assert pair["first_nonfinite"] is None
    assert pair["inputs"] == {"input_hash_equal": True, "param_hash_equal": True,
                              "broken": False}
    assert pair["notes"] == []

    # Skipped on both sides: listed with the statuses, nothing to compare.
    skipped = pair_of(report, variant="tf32")
    assert (skipped["a"]["status"], skipped["b"]["status"]) == ("skipped", "skipped")
    assert "TF32" in skipped["a"]["reason"]
    assert skipped["compared"] is False and skipped["tensors"] == []
    assert skipped["summary"] is None


def test_a_run_against_itself(api):
    upload(api, run_document(run_id="only", shift=1e-3))
    report = compare_ok(api, run_a="only", run_b="only")
    pair = pair_of(report)
    assert {t["verdict"] for t in pair["tensors"]} == {"identical"}
    assert pair["first_divergent_layer"] is None
    assert report["environment"] == []


def test_shifted_run_diverges_at_conv2_with_metrics_of_b_against_a(api):
    reference = run_document("stock", run_id="ref")
    candidate = run_document("mkl", run_id="cand", shift=1e-3,
                             env_vars={"MKL_CBWR": "COMPATIBLE"})
    upload(api, reference, candidate)
    report = compare_ok(api, run_a="ref", run_b="cand")

    assert report["environment"] == [
        {"attribute": "env_vars.MKL_CBWR", "a": "unset", "b": "COMPATIBLE",
         "a_short": "unset", "b_short": "COMPATIBLE"}]
    assert report["run_a"]["env_key"] != report["run_b"]["env_key"]

    pair = pair_of(report)
    verdicts = {t["name"]: t["verdict"] for t in pair["tensors"]}
    assert verdicts == {"conv1": "identical", "conv2": "divergent", "fc1": "divergent",
                        "output": "divergent"}
    assert pair["summary"]["verdicts"] == {"identical": 1, "equivalent": 0, "divergent": 3,
                                           "nonfinite": 0}
    assert pair["summary"]["outputs"] == [{"name": "output", "verdict": "divergent"}]
    assert pair["summary"]["output_verdict"] == "divergent"
    # The whole result: the worst of every tensor, the first of them in order deciding.
    assert pair["summary"]["result_verdict"] == {"verdict": "divergent", "tensor": "conv2",
                                                 "kind": "layer"}
    assert pair["first_divergent_layer"]["name"] == "conv2"
    assert pair["first_divergent_layer"]["verdict"] == "divergent"
    assert pair["largest_jump"]["name"] == "conv2"
    assert pair["largest_jump"]["previous"] == "conv1"
    assert pair["first_nonfinite"] is None
    assert pair["tolerances"] == {"float32": {"rtol": RTOL, "atol": ATOL}}

    # The oracle: float64 arithmetic on the uploaded bytes, a the reference.
    a = tensor_values(reference, "output")
    b = tensor_values(candidate, "output")
    diff = np.abs(b - a)
    (output,) = [t for t in pair["tensors"] if t["name"] == "output"]
    assert output["basis"] == "values"
    metrics = output["metrics"]
    assert metrics["max_abs"] == pytest.approx(diff.max(), rel=1e-12)
    assert metrics["max_rel"] == pytest.approx((diff / np.abs(a)).max(), rel=1e-12)
    assert metrics["rmse"] == pytest.approx(np.sqrt(np.mean(diff**2)), rel=1e-12)
    assert metrics["rel_l2"] == pytest.approx(np.linalg.norm(b - a) / np.linalg.norm(a),
                                              rel=1e-12)
    assert metrics["mismatch_fraction"] == pytest.approx(
        np.mean(diff > ATOL + RTOL * np.abs(a)), rel=1e-12)
    # b against a, not a against b: swapping the runs changes max_rel.
    swapped = pair_of(compare_ok(api, run_a="cand", run_b="ref"))
    (output_swapped,) = [t for t in swapped["tensors"] if t["name"] == "output"]
    assert output_swapped["metrics"]["max_rel"] == pytest.approx((diff / np.abs(b)).max(),
                                                                 rel=1e-12)


def test_nan_from_fc1_on_is_the_first_nonfinite(api):
    upload(api, run_document("stock", run_id="ref"),
           run_document("flaky", run_id="nan", nan_from="fc1"))
    pair = pair_of(compare_ok(api, run_a="ref", run_b="nan"))

    assert pair["first_nonfinite"] == {
        "name": "fc1", "kind": "layer", "order": 2, "nan": 1, "inf": 0,
        "reference_nan": 0, "reference_inf": 0}
    verdicts = {t["name"]: t["verdict"] for t in pair["tensors"]}
    assert verdicts == {"conv1": "identical", "conv2": "identical", "fc1": "nonfinite",
                        "output": "nonfinite"}
    assert pair["summary"]["output_verdict"] == "nonfinite"
    assert pair["summary"]["result_verdict"] == {"verdict": "nonfinite", "tensor": "fc1",
                                                 "kind": "layer"}
    assert pair["first_divergent_layer"]["name"] == "fc1"
    # The NaN is in run b only: the other way round, a has none that b lacks.
    assert pair_of(compare_ok(api, run_a="nan", run_b="ref"))["first_nonfinite"] is None


def without_outputs(document):
    """A workload like train or probes: no tensor of kind output."""
    for result in document["results"]:
        for tensor in result.get("tensors", []):
            tensor["kind"] = "probe"
    return document


def test_a_workload_without_outputs_still_gets_a_verdict_for_the_whole_result(api):
    upload(api, without_outputs(run_document("stock", run_id="ref")),
           without_outputs(run_document("other", run_id="cand", shift=1e-3)),
           without_outputs(run_document("same", run_id="same")))
    pair = pair_of(compare_ok(api, run_a="ref", run_b="cand"))
    assert pair["summary"]["output_verdict"] is None
    assert pair["summary"]["result_verdict"] == {"verdict": "divergent", "tensor": "conv2",
                                                 "kind": "probe"}
    identical = pair_of(compare_ok(api, run_a="ref", run_b="same"))
    assert identical["summary"]["result_verdict"]["verdict"] == "identical"


def test_a_long_environment_value_is_shown_as_the_line_that_differs(api):
    config = "\n".join(f"  - option {i}: value {i}" for i in range(40))
    reference, candidate = run_document("a", run_id="ref"), run_document("b", run_id="cand")
    reference["environment"]["torch"]["config"] = config
    candidate["environment"]["torch"]["config"] = config.replace("value 17", "value 17b")
    rekey(reference["environment"])
    rekey(candidate["environment"])  # another environment
    upload(api, reference, candidate)
    (difference,) = compare_ok(api, run_a="ref", run_b="cand")["environment"]
    assert difference["attribute"] == "torch.config"
    assert (difference["a"], difference["b"]) == (reference["environment"]["torch"]["config"],
                                                  candidate["environment"]["torch"]["config"])
    assert difference["a_short"] == "line 18: - option 17: value 17"
    assert difference["b_short"] == "line 18: - option 17: value 17b"


def test_workload_and_variant_filters(api):
    kwargs = {"workloads": ("cnn", "mlp"), "variants": ("default", "strict")}
    upload(api, run_document("node-1", run_id="a", **kwargs),
           run_document("node-2", run_id="b", shift=1e-3, **kwargs))

    everything = compare_ok(api, run_a="a", run_b="b")
    assert len(everything["pairs"]) == 6  # 2 workloads x (default, strict, tf32)

    mlp = compare_ok(api, run_a="a", run_b="b", workload="mlp")
    assert mlp["workload"] == "mlp" and mlp["variant"] is None
    assert sorted((p["workload"], p["variant"]) for p in mlp["pairs"]) == [
        ("mlp", "default"), ("mlp", "strict"), ("mlp", "tf32")]

    one = compare_ok(api, run_a="a", run_b="b", workload="mlp", variant="strict")
    (pair,) = one["pairs"]
    assert (pair["workload"], pair["variant"]) == ("mlp", "strict")
    assert pair["first_divergent_layer"]["name"] == "conv2"

    strict = compare_ok(api, run_a="a", run_b="b", variant="strict")
    assert sorted(p["workload"] for p in strict["pairs"]) == ["cnn", "mlp"]


def test_results_in_one_run_only_and_a_failed_side(api):
    reference = run_document("node-1", run_id="a")
    candidate = run_document("node-2", run_id="b", variants=("default", "strict"))
    candidate["results"][0] = {
        "suite": "standard", "workload": "cnn", "workload_version": 1, "variant": "default",
        "device": "cpu", "status": "failed", "error": "RuntimeError: CUDA error",
        "input_hash": "in-" + "0" * 61, "param_hash": "p" * 64}
    upload(api, reference, candidate)
    report = compare_ok(api, run_a="a", run_b="b")

    pair = pair_of(report)
    assert (pair["a"]["status"], pair["b"]["status"]) == ("ok", "failed")
    assert pair["b"]["error"] == "RuntimeError: CUDA error"
    assert pair["compared"] is False and pair["tensors"] == []
    assert pair["first_divergent_layer"] is None
    assert report["only_in_a"] == []
    assert report["only_in_b"] == [
        {"suite": "standard", "workload": "cnn", "variant": "strict", "device": "cpu"}]
    assert compare_ok(api, run_a="b", run_b="a")["only_in_a"] == report["only_in_b"]


def test_different_inputs_are_broken_inputs_not_a_divergence(api):
    upload(api, run_document("node-1", run_id="a"),
           run_document("node-2", run_id="b", input_hash="in-" + "1" * 61))
    pair = pair_of(compare_ok(api, run_a="a", run_b="b"))
    assert pair["inputs"] == {"input_hash_equal": False, "param_hash_equal": True,
                              "broken": True}
    assert pair["notes"] == ["input_hash differ: broken inputs, not a divergence"]


def test_drills_are_reported_and_result_drill_entries_ignored(api):
    drill = run_document("node-2", run_id="drill", drill=True)
    drill["results"][0]["drill"] = {"layer": "conv2", "index": 17, "bit": 20}
    upload(api, run_document("node-1", run_id="a"), drill)
    report = compare_ok(api, run_a="a", run_b="drill")
    assert (report["run_a"]["drill"], report["run_b"]["drill"]) == (False, True)
    assert "drill" not in pair_of(report)


def test_unknown_runs_are_404_naming_them(api):
    upload(api, run_document(run_id="a"))
    response = get_compare(api, run_a="a", run_b="nope")
    assert response.status_code == 404
    assert response.json() == {"error": "not_found", "detail": "no run with run_id 'nope'"}
    detail = get_compare(api, run_a="gone", run_b="nope").json()["detail"]
    assert "'gone'" in detail and "'nope'" in detail


def test_filters_that_match_nothing_in_common_are_404_naming_the_run(api):
    candidate = run_document("node-2", run_id="b", variants=("default", "strict"))
    candidate["results"][0]["device"] = "cuda:0"
    upload(api, run_document("node-1", run_id="a"), candidate)

    response = get_compare(api, run_a="a", run_b="b", variant="strict")
    assert response.status_code == 404
    assert response.json()["detail"] == "run 'a' has no result of variant 'strict'"

    detail = get_compare(api, run_a="a", run_b="b", workload="resnet").json()["detail"]
    assert detail == "neither run 'a' nor run 'b' has a result of workload 'resnet'"

    # Both runs have cnn/default, on different devices: nothing to compare.
    response = get_compare(api, run_a="a", run_b="b", workload="cnn", variant="default")
    assert response.status_code == 404
    assert response.json()["detail"] == (
        "no result of workload 'cnn' and variant 'default' is in both runs: run 'a' has "
        "standard/cnn/default/cpu, run 'b' has standard/cnn/default/cuda:0")


def test_compare_needs_a_reader_and_both_runs(api):
    upload(api, run_document(run_id="a"))
    response = api.client.get("/api/v1/compare", params={"run_a": "a", "run_b": "a"})
    assert response.status_code == 401
    response = get_compare(api, run_a="a")
    assert response.status_code == 422
    assert [e["loc"] for e in response.json()["detail"]] == [["query", "run_b"]]


def test_the_policy_tolerance_applies(make_api, tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text("[tolerances.workloads.cnn]\nfloat32 = {rtol = 1e-2, atol = 1e-5}\n")
    documents = (run_document("node-1", run_id="a"),
                 run_document("node-2", run_id="b", shift=1e-3))
    default, loose = make_api(), make_api(policy_file=policy)
    upload(default, *documents)

    before = pair_of(compare_ok(default, run_a="a", run_b="b"))
    after = pair_of(compare_ok(loose, run_a="a", run_b="b"))
    assert before["summary"]["output_verdict"] == "divergent"
    # A relative error of 1e-3 is within the lab's 1e-2 for cnn.
    assert after["summary"]["output_verdict"] == "equivalent"
    assert after["tolerances"] == {"float32": {"rtol": 1e-2, "atol": 1e-5}}
    # conv2 moved by 1e-3 absolute, beyond 1e-2 relative of its values near zero.
    assert after["first_divergent_layer"]["name"] == "conv2"
    assert after["first_divergent_layer"]["verdict"] == "divergent"


def count_statements(api, **params):
    engine = api.client.app.state.engine
    statements = []

    def count(_conn, _cursor, statement, *_args):
        statements.append(statement)

    event.listen(engine, "before_cursor_execute", count)
    try:
        report = compare_ok(api, **params)
    finally:
        event.remove(engine, "before_cursor_execute", count)
    return len(statements), report


def test_statements_do_not_grow_with_results_or_tensors_once_kept(api):
    """A pair of results is compared once (its summary and rows kept by content); asked
    again, /compare reads a fixed number of statements whatever the runs' size."""
    upload(api, run_document("node-1", run_id="small-a"),
           run_document("node-2", run_id="small-b", shift=1e-3))
    big = {"workloads": ("cnn", "mlp", "rnn", "vit"),
           "variants": ("default", "strict", "fp64-reference")}
    upload(api, run_document("node-1", run_id="big-a", **big),
           run_document("node-2", run_id="big-b", shift=1e-3, **big))

    first_small, small = count_statements(api, run_a="small-a", run_b="small-b")
    first_big, report = count_statements(api, run_a="big-a", run_b="big-b")
    small_count, again_small = count_statements(api, run_a="small-a", run_b="small-b")
    big_count, again = count_statements(api, run_a="big-a", run_b="big-b")
    assert again == report and again_small == small
    assert sum(len(p["tensors"]) for p in report["pairs"]) == 48
    assert sum(len(p["tensors"]) for p in small["pairs"]) == 4
    assert big_count == small_count  # however many results and tensors


def test_openapi_documents_compare_with_an_example(api):
    schema = api.client.get("/openapi.json").json()
    operation = schema["paths"]["/api/v1/compare"]["get"]
    assert {p["name"] for p in operation["parameters"]} >= {"run_a", "run_b", "workload",
                                                           "variant"}
    example = operation["responses"]["200"]["content"]["application/json"]["example"]
    assert example["pairs"][0]["first_divergent_layer"]["name"] == "conv2"
    # The example is a valid response.
    CompareOut.model_validate(COMPARE_EXAMPLE)
