"""The workload page reads every variant's /divergence in one request, under one budget of
computing time (`NUMPARITY_COMPUTE_SECONDS`): once the first variants spent it, a later
variant's comparisons of its answers still run (only an origin may be left pending),
where the page answered 500 (a comparison missing from the report)."""

from __future__ import annotations

from helpers.documents import cnn_tensors, run_document


def upgraded(node: str, default_shift: float, strict_shift: float) -> dict:
    document = run_document(node, variants=("default", "strict"), shift=default_shift)
    for result in document["results"]:
        if result.get("variant") == "strict":
            result["tensors"] = cnn_tensors(strict_shift)
    return document


def test_a_later_variants_comparisons_run_once_the_time_is_spent(make_api):
    api = make_api(compute_seconds=0, read_cache_max_age_s=0)
    # Two answers under each variant, other pairs of answers under each: each variant
    # computes comparisons of its own.
    for document in (upgraded("a", 0.0, 0.0), upgraded("b", 1e-3, 2e-3)):
        assert api.post_run(document).status_code == 201
    response = api.client.get("/workloads/cnn?tensor=output", headers=api.reader)
    assert response.status_code == 200, response.text[:2000]
    assert "strict" in response.text and "pending" not in response.text.lower()
