"""POST and GET /api/v1/explanations and `reads.explanations.explanations_between`
(design §2.11, §3.2): the findings of `numparity-agent explain`, as the agent sends them,
stored per finding, listed, shown beside a split, and marked stale once the node changes."""

from __future__ import annotations

import gzip
import json
import re
from datetime import timedelta
from html import unescape
from typing import Any

import pytest
from helpers.documents import run_document
from sqlalchemy import func, select, update

from numparity_agent import _explain
from numparity_agent._settings import Setting
from numparity_server.auth import service as auth_service
from numparity_server.kit.db import get_engine, session_factory
from numparity_server.models import Explanation, Run, utcnow
from numparity_server.reads.explanations import explanations_between
from numparity_server.retention.service import apply_retention

MKL = {"MKL_CBWR": "COMPATIBLE"}


def target(device: str = "cpu", workload: str = "cnn") -> _explain.Target:
    return _explain.Target(suite="standard", workload=workload, workload_version=1,
                           variant="default", device=device,
                           tensors=(("output", "e" * 64),))


def reproduced(setting: Setting, **target_fields: str) -> _explain.Finding:
    return _explain.Finding(target=target(**target_fields), status="reproduced",
                            setting=setting, tried=1, seconds=4.4)


def missed(**target_fields: str) -> _explain.Finding:
    finding = _explain.Finding(target=target(**target_fields), tried=40, seconds=110.0)
    closest = Setting.of(knobs={"threads": 1})
    finding.closest = {"label": closest.label(), "setting": closest.to_json(), "matching": 3,
                       "tensors": 4, "first_differing": "output"}
    return finding


def document(node: str, against: str, *findings: _explain.Finding,
             env_key: str | None = None) -> dict[str, Any]:
    """What the agent posts: its own `explanation_document`."""
    explained = _explain.Explained(list(findings or (reproduced(Setting.of(env=MKL)),)),
                                   env_key)
    return _explain.explanation_document(
        explained, node=node, against=against,
        device="cpu", started_at="2026-11-21T12:00:00Z", finished_at="2026-11-21T12:00:05Z")


def post(api: Any, body: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
    return api.client.post("/api/v1/explanations", json=body,
                           headers=api.agent if headers is None else headers)


def listed(api: Any, **params: Any) -> dict[str, Any]:
    answer = api.client.get("/api/v1/explanations", params=params, headers=api.reader)
    assert answer.status_code == 200, answer.text
    return answer.json()


def stored(api: Any) -> int:
    with session_factory(get_engine(api.settings))() as session:
        return session.scalar(select(func.count()).select_from(Explanation)) or 0


def between(api: Any, nodes_a: set[str], nodes_b: set[str], **kwargs: Any) -> list[Any]:
    key = {"suite": "standard", "workload": "cnn", "variant": "default", **kwargs}
    with session_factory(get_engine(api.settings))() as session:
        return explanations_between(session=session, nodes_a=nodes_a, nodes_b=nodes_b, **key)


@pytest.fixture
def lab(api: Any) -> dict[str, str]:
    """lab-01 (stock) and lab-mkl (MKL_CBWR=COMPATIBLE, other bits): their run ids."""
    runs = {"lab-01": run_document("lab-01", started_at="2026-11-21T10:00:00Z"),
            "lab-mkl": run_document("lab-mkl", env_vars=MKL, shift=1e-3,
                                    started_at="2026-11-21T10:00:00Z")}
    for run in runs.values():
        assert api.post_run(run).status_code == 201
    return {node: run["run_id"] for node, run in runs.items()}


def test_findings_round_trip_to_the_list_and_beside_the_split(api, lab):
    there = post(api, document("lab-01", lab["lab-mkl"]))
    assert there.status_code == 201, there.text
    assert there.json() == {"stored": 1}
    back = post(api, document("lab-mkl", lab["lab-01"],
                              reproduced(Setting.of(env={"MKL_CBWR": None}))))
    assert back.status_code == 201, back.text

    page = listed(api)
    assert page["total"] == 2 and page["limit"] == 50 and page["offset"] == 0
    newest, oldest = page["items"]
    assert set(newest) == {"node", "target", "against_node", "against_run", "suite", "workload",
                           "workload_version", "variant", "device", "local_device", "status",
                           "label", "setting", "tried", "seconds", "closest", "detail",
                           "created_at", "stale", "claimed_by", "verified", "verification",
                           "text_looks_like_command"}
    assert {k: v for k, v in oldest.items() if k != "created_at"} == {
        "node": "lab-01", "target": "run", "against_node": "lab-mkl",
        "against_run": lab["lab-mkl"],
        "suite": "standard", "workload": "cnn", "workload_version": 1, "variant": "default",
        "device": "cpu", "local_device": "cpu", "status": "reproduced",
        "label": "MKL_CBWR=COMPATIBLE", "setting": {"env": MKL, "knobs": {}}, "tried": 1,
        "seconds": 4.4, "closest": None, "detail": None, "stale": False,
        "claimed_by": "lab-01", "verified": "in_reference_environment",
        "verification": "the reference's recorded environment has this setting",
        "text_looks_like_command": False}
    assert (newest["node"], newest["label"], newest["setting"]) == (
        "lab-mkl", "MKL_CBWR unset", {"env": {"MKL_CBWR": None}, "knobs": {}})
    # lab-01 did not set MKL_CBWR: the setting is what lab-01 recorded of itself.
    assert newest["verified"] == "in_reference_environment"

    assert [i["node"] for i in listed(api, node="lab-01")["items"]] == ["lab-01"]
    assert [i["node"] for i in listed(api, against_node="lab-01")["items"]] == ["lab-mkl"]
    assert listed(api, workload="mlp")["total"] == 0
    assert listed(api, variant="default", limit=1, offset=1)["items"] == [oldest]

    # Beside the split: both directions, whichever side is a.
    for sides in (({"lab-01"}, {"lab-mkl"}), ({"lab-mkl"}, {"lab-01"})):
        found = between(api, *sides)
        assert [(f.node, f.against_node, f.label) for f in found] == [
            ("lab-mkl", "lab-01", "MKL_CBWR unset"), ("lab-01", "lab-mkl", "MKL_CBWR=COMPATIBLE")]
    assert between(api, {"lab-01"}, {"lab-mkl"}, limit=1)[0].node == "lab-mkl"
    assert between(api, {"lab-01"}, {"lab-mkl"}, variant="strict") == []
    assert between(api, {"lab-01"}, {"other"}) == []
    assert between(api, {"lab-01", "lab-mkl"}, set()) == []

    # A newer finding of the same pair replaces the older one beside the split.
    again = post(api, document("lab-01", lab["lab-mkl"], missed()))
    assert again.status_code == 201
    found = between(api, {"lab-01"}, {"lab-mkl"})
    assert [(f.node, f.status) for f in found] == [("lab-01", "not_reproduced"),
                                                   ("lab-mkl", "reproduced")]
    assert found[0].closest is not None and found[0].closest.model_dump() == {
        "label": "threads=1", "setting": {"env": {}, "knobs": {"threads": 1}}, "matching": 3,
        "tensors": 4, "first_differing": "output"}
    assert listed(api)["total"] == 3


def test_a_finding_is_stale_once_its_node_runs_on_another_environment(api, lab):
    assert post(api, document("lab-01", lab["lab-mkl"])).status_code == 201
    assert [i["stale"] for i in listed(api)["items"]] == [False]
    # The same environment again: still current.
    assert api.post_run(run_document("lab-01", started_at="2026-11-21T11:00:00Z")
                        ).status_code == 201
    assert [i["stale"] for i in listed(api)["items"]] == [False]
    upgraded = run_document("lab-01", env_vars={"OMP_NUM_THREADS": "1"},
                            started_at="2026-11-21T12:00:00Z")
    assert api.post_run(upgraded).status_code == 201
    assert [i["stale"] for i in listed(api)["items"]] == [True]
    (finding,) = between(api, {"lab-01"}, {"lab-mkl"})
    assert finding.stale
    # What the node finds on its new environment is current.
    assert post(api, document("lab-01", lab["lab-mkl"], missed())).status_code == 201
    assert [i["stale"] for i in listed(api)["items"]] == [False, True]


def test_findings_hold_for_the_environment_explain_ran_in(api, lab):
    # lab-01 runs explain from a shell with MKL_CBWR=COMPATIBLE set: the environment of
    # lab-mkl's run, not lab-01's newest. Its findings are stale for lab-01 as it runs.
    mkl_env = json.loads(json.dumps(run_document("x", env_vars=MKL)))["environment"]["env_key"]
    other_shell = document("lab-01", lab["lab-mkl"], env_key=mkl_env)
    assert post(api, other_shell).status_code == 201
    assert [i["stale"] for i in listed(api)["items"]] == [True]
    # An environment the server does not know: the node's newest, as without env_key.
    unknown = document("lab-01", lab["lab-mkl"], missed(), env_key="f" * 64)
    assert post(api, unknown).status_code == 201
    assert [i["stale"] for i in listed(api)["items"]] == [False, True]
    bad = document("lab-01", lab["lab-mkl"], env_key="not-a-key")
    assert post(api, bad).status_code == 422


def bound_agent(api: Any, node: str) -> tuple[dict[str, str], int]:
    with session_factory(get_engine(api.settings))() as session:
        created = auth_service.create_token(session=session, role="agent", label="bound",
                                            node_names=(node,))
    return {"Authorization": f"Bearer {created.token}"}, created.id


def test_a_bound_token_posts_only_for_its_node(api, lab):
    headers, token_id = bound_agent(api, "lab-01")
    refused = post(api, document("lab-mkl", lab["lab-01"]), headers)
    assert refused.status_code == 403
    assert refused.json() == {"error": "node_forbidden", "detail": (
        f"token {token_id} is bound to lab-01: it may not write explanations of node "
        "'lab-mkl'")}
    assert stored(api) == 0
    assert post(api, document("lab-01", lab["lab-mkl"]), headers).status_code == 201
    assert post(api, document("lab-01", lab["lab-mkl"]), api.reader).status_code == 403
    assert api.client.get("/api/v1/explanations", headers=api.agent).status_code == 403


def test_the_run_the_node_and_the_results_must_be_stored(api, lab):
    unknown_run = post(api, document("lab-01", "no-such-run"))
    assert unknown_run.status_code == 422
    assert unknown_run.json()["detail"] == [
        {"loc": ["body", "against"], "msg": "no run with run_id 'no-such-run'"}]

    unknown_node = post(api, document("lab-02", lab["lab-mkl"]))
    assert unknown_node.status_code == 422
    ((error,),) = [unknown_node.json()["detail"]]
    assert error["loc"] == ["body", "node"]
    assert error["msg"].startswith("node 'lab-02' has uploaded no run")

    other_result = post(api, document("lab-01", lab["lab-mkl"], reproduced(
        Setting.of(env=MKL)), reproduced(Setting.of(env=MKL), device="cuda:0")))
    assert other_result.status_code == 422
    assert other_result.json()["detail"] == [{"loc": ["body", "findings", 1], "msg": (
        f"run {lab['lab-mkl']!r} has no ok result of standard/cnn/default on device "
        "'cuda:0'")}]
    assert stored(api) == 0


def valid(api: Any, lab: dict[str, str]) -> dict[str, Any]:
    return document("lab-01", lab["lab-mkl"])


@pytest.mark.parametrize("change, loc", [
    (lambda d: d.update(findings=d["findings"] * 257), ["body", "findings"]),
    (lambda d: d["findings"][0].update(status="maybe"), ["body", "findings", 0, "status"]),
    (lambda d: d["findings"][0].update(seconds=-1.0), ["body", "findings", 0, "seconds"]),
    (lambda d: d["findings"][0].update(tried=-1), ["body", "findings", 0, "tried"]),
    (lambda d: d["findings"][0].update(tried="1"), ["body", "findings", 0, "tried"]),
    (lambda d: d["findings"][0].update(setting=None), ["body", "findings", 0]),
    (lambda d: d["findings"][0]["setting"].update(
        env={f"V{i}": "1" for i in range(33)}), ["body", "findings", 0, "setting", "env"]),
    (lambda d: d["findings"][0]["setting"].update(knobs={"threads": [1]}),
     ["body", "findings", 0, "setting", "knobs", "threads", "bool"]),
    (lambda d: d["findings"][0].update(detail="x" * 16_385), ["body", "findings", 0, "detail"]),
    (lambda d: d.update(node="n" * 256), ["body", "node"]),
    (lambda d: d.update(against="../runs"), ["body", "against"]),
    (lambda d: d.update(findings=d["findings"] * 2), ["body"]),
    (lambda d: d.pop("finished_at"), ["body", "finished_at"]),
])
def test_a_document_out_of_bounds_is_refused_naming_the_field(api, lab, change, loc):
    body = valid(api, lab)
    change(body)
    answer = post(api, body)
    assert answer.status_code == 422, answer.text
    assert loc in [e["loc"] for e in answer.json()["detail"]], answer.json()
    assert stored(api) == 0


def test_schema_versions_gzip_and_an_empty_document(api, lab):
    other = {**valid(api, lab), "schema": "numparity.explain/v9"}
    answer = post(api, other)
    assert answer.status_code == 400
    assert "numparity.explain/v1" in answer.json()["detail"]

    body = gzip.compress(json.dumps(valid(api, lab)).encode())
    zipped = api.client.post("/api/v1/explanations", content=body,
                             headers={**api.agent, "Content-Encoding": "gzip",
                                      "Content-Type": "application/json"})
    assert zipped.status_code == 201, zipped.text

    empty = document("lab-01", lab["lab-mkl"])
    empty["findings"] = []
    assert post(api, empty).json() == {"stored": 0}
    assert stored(api) == 1


def test_retention_drops_a_run_with_its_findings(make_api, monkeypatch):
    api = make_api()
    old = run_document("lab-mkl", env_vars=MKL, started_at="2026-09-01T08:00:00Z")
    new = run_document("lab-mkl", env_vars=MKL, started_at="2026-11-21T08:00:00Z")
    mine = run_document("lab-01", started_at="2026-11-21T08:00:00Z")
    for run in (old, new, mine):
        assert api.post_run(run).status_code == 201
    for against in (old, new):
        assert post(api, document("lab-01", against["run_id"])).status_code == 201
    sessions = session_factory(get_engine(api.settings))
    with sessions() as session, session.begin():
        session.execute(update(Run).where(Run.run_id == old["run_id"])
                        .values(received_at=utcnow() - timedelta(days=60)))
    report = apply_retention(sessions=sessions, days=30)
    assert report.runs == 1
    assert [i["against_run"] for i in listed(api)["items"]] == [new["run_id"]]


def test_the_body_limit_and_the_byte_budget_hold_as_for_runs(make_api):
    api = make_api(max_body_bytes=4096, max_document_bytes=64 * 1024, token_bytes_per_s=1)
    body = document("lab-01", "r1")
    body["findings"][0]["detail"] = "x" * 8192
    too_large = post(api, body)
    assert too_large.status_code == 413
    assert "NUMPARITY_MAX_BODY_BYTES" in too_large.json()["detail"]
    # The bucket holds max_document_bytes and refills at 1 byte/s: a request takes all of
    # it (at least 64 KiB, at most the bucket), the next one waits.
    assert post(api, document("lab-01", "r1")).status_code == 422
    over_budget = post(api, document("lab-01", "r1"))
    assert over_budget.status_code == 429 and "Retry-After" in over_budget.headers


def test_compare_and_divergence_show_the_findings_beside_the_split(api, lab):
    stock = run_document("lab-02", started_at="2026-11-21T10:00:00Z")
    assert api.post_run(stock).status_code == 201
    assert post(api, document("lab-01", lab["lab-mkl"])).status_code == 201
    assert post(api, document("lab-mkl", lab["lab-01"], reproduced(
        Setting.of(env={"MKL_CBWR": None})))).status_code == 201

    def compare(run_a: str, run_b: str) -> list[tuple[str, str, str]]:
        answer = api.client.get("/api/v1/compare", headers=api.reader, params={
            "run_a": run_a, "run_b": run_b, "workload": "cnn", "variant": "default"})
        assert answer.status_code == 200, answer.text
        (pair,) = answer.json()["pairs"]
        return sorted((e["node"], e["against_node"], e["label"]) for e in pair["explanations"])

    both = [("lab-01", "lab-mkl", "MKL_CBWR=COMPATIBLE"), ("lab-mkl", "lab-01", "MKL_CBWR unset")]
    assert compare(lab["lab-01"], lab["lab-mkl"]) == both
    assert compare(lab["lab-mkl"], lab["lab-01"]) == both
    # Between lab-02 and lab-mkl nobody explained anything.
    assert compare(stock["run_id"], lab["lab-mkl"]) == []

    answer = api.client.get("/api/v1/divergence", headers=api.reader,
                            params={"workload": "cnn", "variant": "default"})
    assert answer.status_code == 200, answer.text
    (pair,) = answer.json()["pairs"]
    # The stock group (lab-01, lab-02) against lab-mkl: both of lab-01's directions.
    assert sorted((e["node"], e["label"]) for e in pair["explanations"]) == [
        ("lab-01", "MKL_CBWR=COMPATIBLE"), ("lab-mkl", "MKL_CBWR unset")]


def test_the_pages_show_the_setting_beside_the_split(api, lab):
    assert post(api, document("lab-01", lab["lab-mkl"])).status_code == 201
    assert post(api, document("lab-mkl", lab["lab-01"], missed())).status_code == 201

    def findings(path: str) -> list[str]:
        answer = api.client.get(path, headers=api.reader)
        assert answer.status_code == 200, answer.text[:2000]
        items = re.findall(r'<li data-explain="[^"]+" data-status="[^"]+"[^>]*>(.*?)</li>',
                           answer.text, re.S)
        return [" ".join(unescape(re.sub(r"<[^>]+>", "", item)).split()) for item in items]

    for path in (f"/compare?run_a={lab['lab-01']}&run_b={lab['lab-mkl']}&workload=cnn"
                 "&variant=default", "/workloads/cnn"):
        shown = findings(path)
        assert len(shown) == 2, (path, shown)
        assert shown[0].startswith("lab-mkl claims it gives lab-01's bits under no single "
                                   "setting or pair it tried (40); closest threads=1, 3 of 4 "
                                   "tensors the same (first differing output)")
        assert shown[1].startswith("lab-01 claims it gives lab-mkl's bits with "
                                   "MKL_CBWR=COMPATIBLE")


# ---- --target eager: a compiled result against its own run's eager answer --------------


def test_an_eager_target_finding_is_listed_as_such_and_never_beside_a_split(api, lab):
    from helpers.documents import cnn_tensors

    run = run_document("lab-01", run_id="with-compiled", started_at="2026-11-21T11:00:00Z")
    run["results"].append({**run["results"][0], "variant": "compiled",
                           "tensors": cnn_tensors(1e-3)})
    assert api.post_run(run).status_code == 201
    inductor = Setting.of(knobs={"inductor.emulate_precision_casts": True})
    finding = _explain.Finding(
        target=_explain.Target(suite="standard", workload="cnn", workload_version=1,
                               variant="compiled", device="cpu",
                               tensors=(("output", "e" * 64),), kind="eager"),
        status="reproduced", setting=inductor, tried=1, seconds=12.5)
    body = _explain.explanation_document(
        _explain.Explained([finding], None), node="lab-01", against="with-compiled",
        device="cpu", started_at="2026-11-21T12:00:00Z", finished_at="2026-11-21T12:01:00Z",
        target="eager")
    assert body["target"] == "eager"
    answer = post(api, body)
    assert answer.status_code == 201, answer.text
    (item,) = listed(api, target="eager")["items"]
    assert {k: item[k] for k in ("node", "target", "against_run", "against_node", "variant",
                                 "status", "label", "verified")} == {
        "node": "lab-01", "target": "eager", "against_run": "with-compiled",
        "against_node": "lab-01", "variant": "compiled", "status": "reproduced",
        "label": "inductor.emulate_precision_casts=true", "verified": "unchecked"}
    assert "explaining node's word" in item["verification"]
    assert listed(api, target="run")["total"] == 0
    # Not a finding between nodes: no split shows it, whichever nodes it is between.
    assert between(api, {"lab-01"}, {"lab-mkl"}, variant="compiled") == []
    with session_factory(get_engine(api.settings))() as session:
        from numparity_server.reads.explanations import explanations_of_key
        assert explanations_of_key(session=session, suite="standard", workload="cnn",
                                   variant="compiled") == []

    # Without the run's eager answer on that device there is nothing to restore.
    bare = run_document("lab-01", run_id="compiled-only", started_at="2026-11-21T11:30:00Z",
                        variants=("fp64-reference",))
    bare["results"].append({**run["results"][-1]})
    assert api.post_run(bare).status_code == 201
    refused = post(api, {**body, "against": "compiled-only"})
    assert refused.status_code == 422
    assert "no ok default result of standard/cnn on device 'cpu'" in refused.text
    assert post(api, {**body, "target": "other"}).status_code == 422


def test_the_compiled_view_and_the_node_page_show_what_restores_eagers_bits(api, lab):
    from helpers.documents import cnn_tensors

    run = run_document("lab-01", run_id="with-compiled", started_at="2026-11-21T11:00:00Z")
    run["results"].append({**run["results"][0], "variant": "compiled",
                           "tensors": cnn_tensors(1e-3)})
    assert api.post_run(run).status_code == 201
    compiled = _explain.Target(suite="standard", workload="cnn", workload_version=1,
                               variant="compiled", device="cpu",
                               tensors=(("output", "e" * 64),), kind="eager")

    def eager_document(finding: _explain.Finding) -> dict[str, Any]:
        return _explain.explanation_document(
            _explain.Explained([finding], None), node="lab-01", against="with-compiled",
            device="cpu", started_at="2026-11-21T12:00:00Z",
            finished_at="2026-11-21T12:01:00Z", target="eager")

    def shown() -> tuple[Any, str]:
        answer = api.client.get("/api/v1/runs/with-compiled/compiled", headers=api.reader)
        assert answer.status_code == 200, answer.text
        (item,) = answer.json()["items"]
        page = api.client.get("/nodes/lab-01", headers=api.reader)
        assert page.status_code == 200
        return item["restores_eager"], page.text

    none_yet, page = shown()
    assert none_yet is None and 'data-restores=""' in page
    nothing = _explain.Finding(target=compiled, tried=15, seconds=61.0)
    assert post(api, eager_document(nothing)).status_code == 201
    finding, page = shown()
    assert (finding["status"], finding["tried"]) == ("not_reproduced", 15)
    assert 'data-restores="not_reproduced">no setting <small>(tried 15)</small>' in page
    # The newest finding is the one shown.
    restored = _explain.Finding(target=compiled, status="reproduced", tried=1, seconds=9.0,
                                setting=Setting.of(knobs={
                                    "inductor.emulate_precision_casts": True}))
    assert post(api, eager_document(restored)).status_code == 201
    finding, page = shown()
    assert (finding["target"], finding["label"]) == (
        "eager", "inductor.emulate_precision_casts=true")
    assert ('data-restores="reproduced"><code>inductor.emulate_precision_casts=true'
            '</code>') in page
