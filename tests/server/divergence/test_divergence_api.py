"""GET /api/v1/divergence on a tiny fleet: two groups, the attribute that splits them."""

from __future__ import annotations

import pytest
from helpers.documents import run_document


@pytest.fixture
def fleet(api):
    documents = [
        run_document("stock-1"),
        run_document("stock-2"),
        run_document("mkl-compatible", shift=1e-3, env_vars={"MKL_CBWR": "COMPATIBLE"}),
        run_document("broken", input_hash="in-" + "1" * 61),
    ]
    for document in documents:
        assert api.post_run(document).status_code == 201
    return api


def get_divergence(api, **params):
    return api.client.get("/api/v1/divergence", params=params, headers=api.reader)


def test_two_groups_and_the_attribute_that_splits_them(fleet):
    response = get_divergence(fleet, workload="cnn", variant="default", tensor="output")
    assert response.status_code == 200, response.text
    report = response.json()
    assert report["key"] == {"suite": "standard", "workload": "cnn", "workload_version": 1,
                             "variant": "default", "tensor": "output"}
    assert [g["nodes"] for g in report["groups"]] == [["stock-1", "stock-2"], ["mkl-compatible"]]
    (pair,) = report["pairs"]
    assert pair["verdict"] == "divergent"
    assert pair["first_divergent_layer"]["name"] == "conv2"
    assert ("env_vars.MKL_CBWR", ["unset"], ["COMPATIBLE"]) in [
        (item["attribute"], item["a"], item["b"]) for item in pair["attribution"]]
    assert report["attribution"][0]["attribute"] == "env_vars.MKL_CBWR"
    # Different input bytes are a bug on that node, not a divergence: left out, and named.
    assert [(e["node"], "input_hash" in e["reason"]) for e in report["excluded"]] == \
        [("broken", True)]


def test_a_layer_tensor_can_be_chosen(fleet):
    report = get_divergence(fleet, workload="cnn", variant="default", tensor="conv1").json()
    assert [g["size"] for g in report["groups"]] == [3]
    assert report["key"]["tensor"] == "conv1"


def test_unknown_key_is_404_with_a_message(fleet):
    response = get_divergence(fleet, workload="cnn", variant="bf16-autocast")
    assert response.status_code == 404
    assert "bf16-autocast" in response.json()["detail"]
    # tf32 exists only as skipped results: nothing to compare either.
    assert get_divergence(fleet, workload="cnn", variant="tf32").status_code == 404


def test_workload_and_variant_are_required(fleet):
    response = get_divergence(fleet, workload="cnn")
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["query", "variant"]


def test_divergence_needs_a_reader(fleet):
    response = fleet.client.get("/api/v1/divergence",
                                params={"workload": "cnn", "variant": "default"})
    assert response.status_code == 401


def test_groups_are_judged_against_the_fp64_reference(api):
    variants = ("default", "strict", "fp64-reference")
    for document in (run_document("stock-1", variants=variants),
                     run_document("stock-2", variants=variants),
                     run_document("drifted", shift=0.5, variants=variants)):
        assert api.post_run(document).status_code == 201
    report = get_divergence(api, workload="cnn", variant="default", tensor="output").json()
    stock, drifted = report["groups"]
    # Here the "fp64" answer equals the stock float32 one: the stock group is exact and
    # acceptable, the drifted group (10x the error allowed) is not.
    assert stock["fp64"]["acceptable"] is True
    assert drifted["fp64"]["acceptable"] is False


def test_the_policy_tolerances_decide_the_verdict(make_api, tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text("[tolerances.workloads.cnn]\nfloat32 = {rtol = 1e-2, atol = 1e-5}\n")
    strict, loose = make_api(), make_api(policy_file=policy)
    for document in (run_document("stock-1"), run_document("stock-2"),
                     run_document("mkl", shift=1e-3, env_vars={"MKL_CBWR": "COMPATIBLE"})):
        assert strict.post_run(document).status_code == 201
    verdicts = [get_divergence(api, workload="cnn", variant="default",
                               tensor="output").json()["pairs"][0]
                for api in (strict, loose)]
    assert [pair["verdict"] for pair in verdicts] == ["divergent", "equivalent"]
    # The same bits differ either way: the first layer that is not identical is the same.
    assert {pair["first_divergent_layer"]["name"] for pair in verdicts} == {"conv2"}


def test_where_nan_first_appears(api):
    for document in (run_document("stock-1"), run_document("stock-2"),
                     run_document("fp16-overflow", nan_from="fc1")):
        assert api.post_run(document).status_code == 201
    (pair,) = get_divergence(api, workload="cnn", variant="default",
                             tensor="output").json()["pairs"]
    assert pair["verdict"] == "nonfinite"
    assert pair["first_nonfinite"]["name"] == "fc1"
    assert pair["first_nonfinite"]["nan"] >= 1 and pair["first_nonfinite"]["reference_nan"] == 0


def test_the_openapi_example_is_a_valid_answer(api):
    from numparity_server.divergence.schemas import EXAMPLE, DivergenceOut

    def without_nulls(value):
        # FastAPI writes the OpenAPI document with exclude_none: an example's nulls go.
        if isinstance(value, dict):
            return {k: without_nulls(v) for k, v in value.items() if v is not None}
        if isinstance(value, list):
            return [without_nulls(v) for v in value]
        return value

    schema = api.client.get("/openapi.json").json()["components"]["schemas"]["DivergenceOut"]
    assert schema["examples"] == [without_nulls(EXAMPLE)]
    DivergenceOut.model_validate(EXAMPLE)


def test_without_a_tensor_results_are_grouped_whole_and_judged_by_their_worst_tensor(api):
    """probes and train have no tensor named output: no default tensor is assumed."""
    for document in (run_document("n-1", run_id="r1"), run_document("n-2", run_id="r2"),
                     run_document("n-3", run_id="r3", nan_from="fc1")):
        for result in document["results"]:
            for tensor in result.get("tensors", []):
                tensor["kind"] = "probe"
        assert api.post_run(document).status_code == 201
    response = api.client.get("/api/v1/divergence", headers=api.reader,
                              params={"workload": "cnn", "variant": "default"})
    assert response.status_code == 200, response.text
    report = response.json()
    assert report["tensor"] is None and report["key"]["tensor"] is None
    assert [g["nodes"] for g in report["groups"]] == [["n-1", "n-2"], ["n-3"]]
    (pair,) = report["pairs"]
    assert (pair["verdict"], pair["decided_by"]) == ("nonfinite", "fc1")
    # The same as /compare's result verdict for the two runs.
    compared = api.client.get("/api/v1/compare", headers=api.reader,
                              params={"run_a": "r1", "run_b": "r3"}).json()
    assert compared["pairs"][0]["summary"]["result_verdict"]["verdict"] == pair["verdict"]


def test_a_tensor_no_result_has_is_404_naming_the_tensors_there_are(api):
    assert api.post_run(run_document("n-1")).status_code == 201
    response = api.client.get("/api/v1/divergence", headers=api.reader,
                              params={"workload": "cnn", "variant": "default",
                                      "tensor": "logits"})
    assert response.status_code == 404
    assert "'logits'" in response.text and "conv1, conv2, fc1, output" in response.text
