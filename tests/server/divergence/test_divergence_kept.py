"""GET /api/v1/divergence at a cost linear in the distinct answers (design §3.3.7): each
group against the baseline, the full matrix a page at a time, members capped with their
counts, and every comparison of two answers computed once and kept."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from helpers.documents import b64, run_document, tensor_entry
from sqlalchemy import delete, func, select

from numparity_server.analysis import ComparisonRecord
from numparity_server.analysis import report as report_module
from numparity_server.divergence import repository
from numparity_server.divergence.service import divergence as divergence_service
from numparity_server.kit.db import get_engine, session_factory, writing
from numparity_server.models import KeptComparison
from numparity_server.reads import kept as kept_store


def get(api, **params):
    response = api.client.get("/api/v1/divergence", headers=api.reader,
                              params={"workload": "cnn", "variant": "default", **params})
    assert response.status_code == 200, response.text
    return response.json()


def kept(api, kind: str = "pair") -> int:
    with session_factory(get_engine(api.settings))() as session:
        return session.scalar(select(func.count()).select_from(KeptComparison)
                              .where(KeptComparison.kind == kind)) or 0


def post(api, *documents) -> None:
    for document in documents:
        response = api.post_run(document)
        assert response.status_code == 201, response.text


# These tests watch the kept comparisons themselves: the whole answer's cache (against
# the fleet's version, kit.readcache) is off so every request reaches them.
NO_READ_CACHE = {"read_cache_max_age_s": 0}


@pytest.fixture
def api(make_api):
    return make_api(**NO_READ_CACHE)


@pytest.fixture
def comparisons(monkeypatch) -> list[tuple[int, int]]:
    """Every comparison of two answers the server computes, as (group a, group b)."""
    calls: list[tuple[int, int]] = []
    compute = report_module.compare_answers

    def counted(a, b, **kwargs):
        calls.append((a.id, b.id))
        return compute(a, b, **kwargs)

    monkeypatch.setattr(report_module, "compare_answers", counted)
    return calls


def fleet(api, answers: int) -> None:
    """Three nodes on the usual answer, then one node for each other answer."""
    post(api, *(run_document(f"stock-{i}") for i in (1, 2, 3)))
    post(api, *(run_document(f"odd-{k:02d}", shift=k * 1e-3) for k in range(1, answers)))


def test_n_answers_give_n_minus_1_baseline_pairs_and_the_full_matrix_by_pages(api):
    fleet(api, 5)
    report = get(api)
    assert (report["pairs_mode"], report["baseline"], report["pairs_total"]) == (
        "baseline", 1, 4)
    assert report["pairs_limit"] is None and report["pairs_offset"] == 0
    assert [(p["a"], p["b"]) for p in report["pairs"]] == [(1, 2), (1, 3), (1, 4), (1, 5)]
    assert report["groups"][0]["nodes"] == ["stock-1", "stock-2", "stock-3"]

    pages = [get(api, pairs="all", pairs_limit=3, pairs_offset=offset)
             for offset in (0, 3, 6, 9, 12)]
    assert {(p["pairs_mode"], p["pairs_total"], p["pairs_limit"]) for p in pages} == {
        ("all", 10, 3)}
    assert [len(page["pairs"]) for page in pages] == [3, 3, 3, 1, 0]
    matrix = [(p["a"], p["b"]) for page in pages for p in page["pairs"]]
    assert matrix == [(a, b) for a in range(1, 6) for b in range(a + 1, 6)]
    # A pair with the baseline reads the same in either mode.
    by_pair = {(p["a"], p["b"]): p for page in pages for p in page["pairs"]}
    for pair in report["pairs"]:
        assert by_pair[(pair["a"], pair["b"])] == pair
    assert get(api, pairs="all")["pairs_limit"] == api.settings.page_default
    # The baseline's pairs page too, when asked.
    paged = get(api, pairs_limit=2, pairs_offset=1)
    assert [(p["a"], p["b"]) for p in paged["pairs"]] == [(1, 3), (1, 4)]
    assert (paged["pairs_mode"], paged["pairs_total"], paged["pairs_limit"],
            paged["pairs_offset"]) == ("baseline", 4, 2, 1)


@pytest.mark.parametrize("name", ["pairs_limit", "members_limit"])
def test_pages_are_bounded_by_page_max(api, name):
    fleet(api, 2)
    response = api.client.get("/api/v1/divergence", headers=api.reader, params={
        "workload": "cnn", "variant": "default", name: api.settings.page_max + 1})
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["query", name]


def test_a_repeated_question_computes_nothing(api, comparisons):
    fleet(api, 4)
    for params in ({}, {"tensor": "output"}):
        comparisons.clear()
        first = get(api, **params)
        assert sorted(comparisons) == [(1, 2), (1, 3), (1, 4)]
        rows = kept(api)
        comparisons.clear()
        again = get(api, **params)
        assert comparisons == [] and kept(api) == rows
        assert again == first
    assert kept(api) == 6  # three pairs by whole result, three by output


def test_a_new_answer_costs_one_comparison(api, comparisons):
    fleet(api, 4)
    get(api)
    assert kept(api) == 3
    comparisons.clear()
    post(api, run_document("odd-99", shift=0.5))
    report = get(api)
    assert len(report["pairs"]) == 4
    assert comparisons == [(1, 5)] and kept(api) == 4
    # A node that gives a known answer computes nothing, even when it becomes its group's
    # representative: grouped by whole result, the representative's manifest is the answer.
    comparisons.clear()
    post(api, run_document("aaa", shift=1e-3))
    report = get(api)
    assert comparisons == [] and kept(api) == 4
    (group,) = [g for g in report["groups"] if "aaa" in g["nodes"]]
    assert group["representative"]["node"] == "aaa" and group["size"] == 2


def test_members_are_capped_with_their_totals(api):
    post(api, *(run_document(f"stock-{i}", env_vars={"RACK": f"r{i}"}) for i in range(7)),
         run_document("odd", shift=1e-3),
         *(run_document(f"broken-{i}", input_hash="in-" + "1" * 61) for i in range(3)))
    report = get(api, members_limit=3)
    usual, odd = report["groups"]
    assert usual["nodes"] == ["stock-0", "stock-1", "stock-2"]
    assert (usual["size"], usual["nodes_total"], usual["env_keys_total"]) == (7, 7, 7)
    assert len(usual["env_keys"]) == 3
    assert odd["nodes"] == ["odd"] and odd["nodes_total"] == 1
    assert [e["node"] for e in report["excluded"]] == ["broken-0", "broken-1", "broken-2"]
    capped = get(api, members_limit=1)
    assert [e["node"] for e in capped["excluded"]] == ["broken-0"]
    assert capped["excluded_total"] == 3 and capped["members_limit"] == 1
    counts = get(api, members_limit=0)
    assert [g["nodes"] for g in counts["groups"]] == [[], []]
    assert [g["size"] for g in counts["groups"]] == [7, 1]
    assert get(api)["members_limit"] == api.settings.page_default


@pytest.mark.parametrize("limit", [1, 2, 5])
def test_walking_names_and_ranking_rows_list_the_same_members(api, monkeypatch, limit):
    """A group's first members by name, found by walking the nodes in name order or by
    ranking the answer's rows (the cheaper is chosen by size), are the same; names are
    in code point order on either database (upper case before lower, digits first)."""
    names = ["Zeta", "alpha", "beta-2", "beta-10", "gamma", "Alpha", "9-node", "delta",
             "é-node", "eta"]
    post(api, *(run_document(name, shift=1e-3 if index % 3 == 0 else 0.0)
                for index, name in enumerate(names)))
    answers = {}
    for cost in (0.0, 1e9):  # always walk, always rank
        monkeypatch.setattr(repository, "WALK_COST", cost)
        report = get(api, members_limit=limit)
        answers[cost] = [(g["size"], g["nodes"], g["representative"]) for g in report["groups"]]
    assert answers[0.0] == answers[1e9]
    shifted = sorted(name for index, name in enumerate(names) if index % 3 == 0)
    usual = sorted(name for index, name in enumerate(names) if index % 3)
    assert [nodes for _size, nodes, _rep in answers[0.0]] == [usual[:limit], shifted[:limit]]
    assert [rep["node"] for _size, _nodes, rep in answers[0.0]] == [usual[0], shifted[0]]


def test_a_kept_verdict_is_what_compare_finds(api):
    """The verdict read back from the table equals /compare's for the representatives'
    runs (another path through the code), and a fresh computation once the row is gone."""
    post(api, run_document("stock-1", run_id="r1"), run_document("stock-2", run_id="r2"),
         run_document("mkl", run_id="r3", shift=1e-3, env_vars={"MKL_CBWR": "COMPATIBLE"}))
    computed = get(api)
    assert kept(api) == 1
    (pair,) = get(api)["pairs"]  # read from the table
    compared = api.client.get("/api/v1/compare", headers=api.reader,
                              params={"run_a": "r1", "run_b": "r3"}).json()
    (result,) = [p for p in compared["pairs"] if p["variant"] == "default"]
    decided = result["summary"]["result_verdict"]
    assert (pair["verdict"], pair["decided_by"]) == (decided["verdict"], decided["tensor"])
    (tensor,) = [t for t in result["tensors"] if t["name"] == decided["tensor"]]
    assert (pair["basis"], pair["metrics"]) == (tensor["basis"], tensor["metrics"])
    layer = result["first_divergent_layer"]
    assert pair["first_divergent_layer"] == {key: layer[key] for key in (
        "name", "order", "verdict", "basis", "metrics")}

    with session_factory(get_engine(api.settings))() as session, writing(session):
        session.execute(delete(KeptComparison))
    assert get(api) == computed and kept(api) == 1


def test_another_policy_does_not_reuse_the_kept_comparisons(make_api, tmp_path,
                                                            comparisons):
    policy = tmp_path / "policy.toml"
    policy.write_text("[tolerances.workloads.cnn]\nfloat32 = {rtol = 1e-2, atol = 1e-5}\n")
    strict, loose = make_api(**NO_READ_CACHE), make_api(policy_file=policy, **NO_READ_CACHE)
    post(strict, run_document("stock-1"), run_document("stock-2"),
         run_document("mkl", shift=1e-3, env_vars={"MKL_CBWR": "COMPATIBLE"}))
    assert get(strict, tensor="output")["pairs"][0]["verdict"] == "divergent"
    assert get(loose, tensor="output")["pairs"][0]["verdict"] == "equivalent"
    assert len(comparisons) == 2 and kept(strict) == 2
    assert get(strict, tensor="output")["pairs"][0]["verdict"] == "divergent"
    assert len(comparisons) == 2


def test_values_that_arrive_later_replace_a_verdict_from_the_sketch(api):
    """conv1 (18,432 elements) travels without its values; once both answers' values are
    stored, the kept comparison is computed again from them (no blind spots)."""
    rng = np.random.default_rng(7)
    arrays = {"usual": rng.standard_normal((4, 32, 12, 12)).astype(np.float32)}
    arrays["odd"] = arrays["usual"] * np.float32(1 + 1e-3)

    def document(node, answer, run_id, started_at, values=False):
        found = run_document(node, run_id=run_id, started_at=started_at)
        entry = tensor_entry("conv1", "layer", 0, arrays[answer])
        if values:
            entry["values"] = {"dtype": "float32", "data": b64(arrays[answer], "f4")}
        found["results"][0]["tensors"][0] = entry
        return found

    post(api, document("stock-1", "usual", "s1", "2026-11-21T10:00:00Z"),
         document("stock-2", "usual", "s2", "2026-11-21T10:00:00Z"),
         document("odd", "odd", "o1", "2026-11-21T10:00:00Z"))
    (pair,) = get(api)["pairs"]
    assert pair["first_divergent_layer"]["name"] == "conv1"
    assert pair["first_divergent_layer"]["basis"] != "values"
    assert pair["first_divergent_layer"]["metrics"]["max_abs"] is None
    post(api, document("stock-1", "usual", "s1b", "2026-11-21T11:00:00Z", values=True),
         document("odd", "odd", "o1b", "2026-11-21T11:00:00Z", values=True))
    (pair,) = get(api)["pairs"]
    assert pair["first_divergent_layer"]["basis"] == "values"
    expected = np.abs(arrays["odd"].astype(np.float64) - arrays["usual"]).max()
    assert pair["first_divergent_layer"]["metrics"]["max_abs"] == pytest.approx(expected)
    assert kept(api) == 1
    with session_factory(get_engine(api.settings))() as session:
        assert session.scalars(select(KeptComparison.awaiting)).all() == [[]]


def test_two_requests_keeping_the_same_comparison_both_succeed(api):
    fleet(api, 2)
    sessions = session_factory(get_engine(api.settings))
    with sessions() as session:
        report = divergence_service(session=session, suite="standard", workload="cnn",
                                    variant="default")
    assert kept(api) == 1
    with sessions() as session:
        (row,) = session.scalars(select(KeptComparison))
        session.expunge_all()
    with sessions() as session, writing(session):
        session.execute(delete(KeptComparison))
    record = ComparisonRecord(row.key, row.kind, row.hash_a, row.hash_b, row.value,
                              tuple(row.awaiting))
    inserted, errors = threading.Event(), []

    def second() -> None:
        inserted.wait(10)
        try:  # waits for the first transaction (the row, or SQLite's writer lock)
            with sessions() as other, writing(other):
                kept_store.keep_comparisons(other, [record])
        except Exception as exc:  # noqa: BLE001 (the test reports whatever it was)
            errors.append(exc)

    thread = threading.Thread(target=second)
    thread.start()
    with sessions() as session, writing(session):
        kept_store.keep_comparisons(session, [record])
        inserted.set()
        thread.join(0.5)  # the second insert is now waiting on this one
    thread.join(10)
    assert not thread.is_alive() and errors == []
    assert kept(api) == 1
    with sessions() as session:
        again = divergence_service(session=session, suite="standard", workload="cnn",
                                   variant="default")
    assert again == report


def test_members_are_paged_with_members_offset(api):
    """Pages of two members, in turn, are each group's whole list (and the excluded
    results'), whichever look-up lists them; the representative stays the first."""
    post(api, *(run_document(f"stock-{i:02d}") for i in range(9)),
         *(run_document(f"odd-{i}", shift=1e-3) for i in range(5)),
         *(run_document(f"broken-{i}", input_hash="in-" + "1" * 61) for i in range(3)))
    whole = get(api, members_limit=100)
    pages = [get(api, members_limit=2, members_offset=offset) for offset in range(0, 12, 2)]
    for number, group in enumerate(whole["groups"]):
        assert [n for page in pages for n in page["groups"][number]["nodes"]] == group["nodes"]
        assert {page["groups"][number]["representative"]["node"] for page in pages} == {
            group["nodes"][0]}
        assert {page["groups"][number]["nodes_total"] for page in pages} == {group["size"]}
    assert [e["node"] for page in pages for e in page["excluded"]] == [
        e["node"] for e in whole["excluded"]]
    assert pages[1]["members_offset"] == 2 and pages[1]["groups"][0]["nodes"] == [
        "stock-02", "stock-03"]
