"""GET /api/v1/runs/{run_id}/compiled: each compiled result against the run's eager one
and float64 (design §3.3.18), from crafted documents checked against numpy."""

from __future__ import annotations

import base64
import math

import numpy as np
import torch
from helpers.documents import cnn_tensors, run_document
from helpers.torch_oracle import expected_verdict

SEVERITY = {"identical": 0, "equivalent": 1, "divergent": 2, "nonfinite": 3}


def document(run_id: str, *, shift: float | None, node: str = "node-c",
             eager: bool = True) -> dict:
    """default and fp64-reference of cnn (the same values), and a compiled result whose
    values are `shift`ed (None: skipped, as torch reports a workload it cannot compile)."""
    doc = run_document(node, run_id=run_id,
                       variants=("default", "fp64-reference") if eager else
                       ("fp64-reference",))
    if shift is None:
        compiled = {"suite": "standard", "workload": "cnn", "workload_version": 1,
                    "variant": "compiled", "device": "cpu", "status": "skipped",
                    "reason": "torch.compile cannot compile cnn: BackendCompilerFailed: …"}
    else:
        compiled = {**doc["results"][0], "variant": "compiled",
                    "tensors": cnn_tensors(shift)}
    doc["results"].append(compiled)
    return doc


def tensor(doc: dict, variant: str, name: str) -> dict:
    (result,) = [r for r in doc["results"] if r.get("variant") == variant
                 and r.get("workload") == "cnn"]
    (found,) = [t for t in result["tensors"] if t["name"] == name]
    return found


def values(doc: dict, variant: str, name: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(tensor(doc, variant, name)["values"]["data"]),
                         dtype="<f4")


def compiled_of(api, run_id: str) -> dict:
    response = api.client.get(f"/api/v1/runs/{run_id}/compiled", headers=api.reader)
    assert response.status_code == 200, response.text
    return response.json()


def test_a_compiled_result_is_judged_against_eager_and_float64(api):
    doc = document("c-1", shift=1e-3)
    assert api.post_run(doc).status_code == 201
    (item,) = compiled_of(api, "c-1")["items"]
    # conv1 (over 4,096 elements, so without its values) is the same bits on both sides.
    names = ["conv2", "fc1", "output"]
    verdicts = {n: expected_verdict(torch.from_numpy(values(doc, "compiled", n).copy()),
                                    torch.from_numpy(values(doc, "default", n).copy()))
                for n in names}
    assert tensor(doc, "compiled", "conv1")["hash"] == tensor(doc, "default", "conv1")["hash"]
    worst = max(verdicts.values(), key=SEVERITY.__getitem__)
    assert (item["status"], item["eager_status"], item["eager_variant"]) == ("ok", "ok",
                                                                           "default")
    assert item["verdict"] == worst == "divergent"
    assert item["decided_by"] == next(n for n in names if verdicts[n] == worst)
    assert item["first_divergent_layer"] == next(n for n in names[:2]
                                                 if verdicts[n] != "identical")
    diffs = [np.abs(values(doc, "compiled", n).astype(np.float64)
                    - values(doc, "default", n)) for n in names]
    assert item["max_abs"] == max(float(d.max()) for d in diffs)
    assert item["max_ulp"] >= 1
    # float64 backs eager here (its answer is the reference's bits): the compiler moved.
    fp64 = item["fp64"]
    reference = values(doc, "fp64-reference", "output").astype(np.float64)
    rmse = math.sqrt(float(np.mean((values(doc, "compiled", "output") - reference) ** 2)))
    assert fp64["tensor"] == "output" and fp64["eager_rmse"] == 0.0
    assert math.isclose(fp64["compiled_rmse"], rmse, rel_tol=1e-9)
    assert fp64["closer"] == "eager"


def test_identical_skipped_and_unpaired_compiled_results_say_so(api):
    for doc in (document("c-same", shift=0.0), document("c-skip", shift=None),
                document("c-alone", shift=1e-3, node="node-d", eager=False)):
        assert api.post_run(doc).status_code == 201
    (same,) = compiled_of(api, "c-same")["items"]
    assert same["verdict"] == "identical" and same["first_divergent_layer"] is None
    assert same["max_abs"] in (None, 0.0) and same["fp64"]["closer"] == "equal"
    (skipped,) = compiled_of(api, "c-skip")["items"]
    assert skipped["status"] == "skipped" and skipped["verdict"] is None
    assert skipped["reason"].startswith("torch.compile cannot compile cnn")
    (alone,) = compiled_of(api, "c-alone")["items"]
    assert alone["verdict"] is None and alone["eager_status"] is None
    assert "no ok default result of cnn on cpu" in alone["note"]
    missing = api.client.get("/api/v1/runs/nope/compiled", headers=api.reader)
    assert missing.status_code == 404 and "no run with run_id 'nope'" in missing.text


# The record an agent writes into a compiled result (agent/_runner.py compile_summary and
# against_eager): two passes, the first cold, and the module localisation found.
COMPILE = {"backend": "inductor", "mode": "default", "cache_dir": "/state/inductor",
           "passes": [{"seconds": 41.5, "cache_hits": 0, "cache_misses": 2, "graphs": 1},
                      {"seconds": 0.8, "cache_hits": 2, "cache_misses": 0, "graphs": 1}],
           "cold_s": 41.5, "warm_s": 0.8}
LOCATED = {"eager_identical": False, "first_differing": "conv2", "differing": 3,
           "module": "conv2", "leaves_tried": 2, "candidates": 2, "seconds": 3.25,
           "kernels": ["cpp_fused_convolution_0", "extern_kernels.mm"]}


def with_record(doc: dict, compile_record: dict | None, located: dict | None) -> dict:
    compiled = doc["results"][-1]
    if compile_record is not None:
        compiled["compile"] = compile_record
    if located is not None:
        compiled["localisation"] = located
    return doc


def test_the_compile_record_and_localisation_are_stored_and_shown(api):
    doc = with_record(document("c-rec", shift=1e-3), COMPILE, LOCATED)
    assert api.post_run(doc).status_code == 201
    (item,) = compiled_of(api, "c-rec")["items"]
    assert item["compile"] == {"backend": "inductor", "mode": "default",
                               "passes": COMPILE["passes"], "pass_count": 2,
                               "cold_s": 41.5, "warm_s": 0.8}
    assert item["localisation"] == {
        "where": "module", "module": "conv2", "kernels": LOCATED["kernels"],
        "first_differing": "conv2", "differing": 3, "leaves_tried": 2, "seconds": 3.25,
        "note": None, "error": None}
    page = api.client.get("/nodes/node-c", headers=api.reader)
    assert page.status_code == 200
    assert "cold 41.5 s, warm 0.8 s" in page.text
    assert "0 hits/2 misses; 2 hits/0 misses" in page.text
    assert ('data-where="module">module <code>conv2</code> <small>(<code>'
            'cpp_fused_convolution_0</code>, <code>extern_kernels.mm</code>)') in page.text


def test_fusion_across_modules_is_named_and_a_result_without_a_record_has_none(api):
    fused = {"eager_identical": False, "first_differing": "fc1", "differing": 2,
             "module": None, "leaves_tried": 3, "kernels": [],
             "note": "every leaf module up to the first differing layer gives eager's bits "
                     "compiled alone: the difference comes from what Inductor fuses across "
                     "modules in the whole graph"}
    assert api.post_run(with_record(document("c-fused", shift=1e-3), None, fused)
                        ).status_code == 201
    (item,) = compiled_of(api, "c-fused")["items"]
    assert item["compile"] is None
    assert item["localisation"]["where"] == "fusion across modules"
    page = api.client.get("/nodes/node-c", headers=api.reader).text
    assert 'data-where="fusion across modules">fusion across modules' in page
    assert api.post_run(document("c-none", shift=1e-3, node="node-n")).status_code == 201
    (bare,) = compiled_of(api, "c-none")["items"]
    assert bare["compile"] is None and bare["localisation"] is None


def test_a_compile_record_is_bounded(api):
    # A thousand repeats: all validated, sixteen stored, the count kept.
    many = {**COMPILE, "passes": COMPILE["passes"][1:] * 1000}
    assert api.post_run(with_record(document("c-many", shift=1e-3), many, None)
                        ).status_code == 201
    (item,) = compiled_of(api, "c-many")["items"]
    assert len(item["compile"]["passes"]) == 16 and item["compile"]["pass_count"] == 1000
    # Beyond the bounds a hostile node could grow storage with, the document is refused,
    # naming the field.
    for field, record, located in (
            ("kernels", None, {**LOCATED, "kernels": ["k"] * 65}),
            ("module", None, {**LOCATED, "module": "m" * 513}),
            ("passes", {**COMPILE, "passes": COMPILE["passes"][1:] * 10_001}, None),
            ("seconds", {**COMPILE, "passes": [{**COMPILE["passes"][0], "seconds": -1}]},
             None)):
        response = api.post_run(with_record(document(f"c-bad-{field}", shift=1e-3),
                                             record, located))
        assert response.status_code == 422, (field, response.text)
        assert field in response.text
