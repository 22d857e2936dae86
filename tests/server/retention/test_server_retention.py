"""`numparity-server retention`: old runs go, each node's latest stays, shared content stays."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from helpers.documents import cnn_tensors, run_document
from helpers.traces import cnn_trace, with_traces
from sqlalchemy import func, select, update

from numparity_server.analysis.groups import manifest_digest
from numparity_server.cli import main
from numparity_server.kit.db import get_engine, session_factory
from numparity_server.models import (
    Environment,
    Fingerprint,
    KeptComparison,
    Latest,
    Manifest,
    Outcome,
    Result,
    Run,
    Trace,
    utcnow,
)
from numparity_server.retention import repository as retention_repository
from numparity_server.retention.service import apply_retention


def counts(api) -> dict[str, int]:
    with session_factory(get_engine(api.settings))() as session:
        return {model.__tablename__: session.scalar(select(func.count()).select_from(model))
                for model in (Run, Result, Outcome, Manifest, Fingerprint, Latest)}


def dangling_latest(api) -> int:
    """latest rows whose result is gone (latest has no foreign key: retention must never
    drop a result a latest row points at)."""
    with session_factory(get_engine(api.settings))() as session:
        return session.scalar(
            select(func.count()).select_from(Latest)
            .outerjoin(Result, Result.id == Latest.result_id).where(Result.id.is_(None))
        ) or 0


def stored_run_ids(api) -> set[str]:
    with session_factory(get_engine(api.settings))() as session:
        return set(session.scalars(select(Run.run_id)))


def fingerprint_hashes(api) -> set[str]:
    with session_factory(get_engine(api.settings))() as session:
        return set(session.scalars(select(Fingerprint.hash)))


@pytest.fixture
def aged(make_api, monkeypatch):
    """node-a: an old run with its own numbers (shift 0.5) and a recent one; node-b: one old
    run (its latest); node-c: two old runs, the newer one its latest (shift 0.25)."""
    monkeypatch.delenv("NUMPARITY_RETENTION_DAYS", raising=False)
    api = make_api()
    # main() exports --database-url for uvicorn's workers; monkeypatch restores it.
    monkeypatch.setenv("NUMPARITY_DATABASE_URL", api.settings.database_url)
    documents = {
        "a-old": run_document("node-a", run_id="a-old", started_at="2026-09-01T08:00:00Z",
                              shift=0.5),
        "a-new": run_document("node-a", run_id="a-new", started_at="2026-11-21T08:00:00Z"),
        "b-old": run_document("node-b", run_id="b-old", started_at="2026-09-01T08:00:00Z"),
        "c-old-1": run_document("node-c", run_id="c-old-1", started_at="2026-09-01T08:00:00Z"),
        "c-old-2": run_document("node-c", run_id="c-old-2", started_at="2026-09-02T08:00:00Z",
                                shift=0.25),
    }
    for document in documents.values():
        assert api.post_run(document).status_code == 201
    with session_factory(get_engine(api.settings))() as session, session.begin():
        session.execute(update(Run).where(Run.run_id.in_(["a-old", "b-old", "c-old-1",
                                                          "c-old-2"]))
                        .values(received_at=utcnow() - timedelta(days=60)))
    return api


def retention(api, *args: str) -> int:
    return main(["--database-url", api.settings.database_url, "retention", *args])


def test_retention_drops_old_runs_but_keeps_latest_and_shared_content(aged, capsys):
    before = counts(aged)
    # Outcomes: one skipped tf32 result shared by all five runs, one ok result per shift.
    assert before == {"runs": 5, "results": 10, "outcomes": 4, "manifests": 3,
                      "fingerprints": 10, "latest": 6}
    only_old_a = {t["hash"] for t in cnn_tensors(0.5)} - {t["hash"] for t in cnn_tensors()}
    assert len(only_old_a) == 3 and only_old_a <= fingerprint_hashes(aged)

    assert retention(aged, "--days", "30", "--dry-run") == 0
    out = capsys.readouterr().out
    assert "would drop 2 runs (4 results)" in out
    assert "1 manifests, 0 op traces and 3 fingerprints" in out
    assert counts(aged) == before

    assert retention(aged, "--days", "30", "--batch-size", "1") == 0
    assert "dropped 2 runs (4 results)" in capsys.readouterr().out
    # a-old is old and not node-a's latest; c-old-1 is superseded by c-old-2. b-old and
    # c-old-2 are old but hold their node's latest results.
    assert stored_run_ids(aged) == {"a-new", "b-old", "c-old-2"}
    assert counts(aged) == {"runs": 3, "results": 6, "outcomes": 3, "manifests": 2,
                            "fingerprints": 7, "latest": 6}
    assert dangling_latest(aged) == 0
    remaining = fingerprint_hashes(aged)
    assert not only_old_a & remaining  # orphaned: gone
    assert {t["hash"] for t in cnn_tensors()} <= remaining  # shared by c-old-1 and a-new

    assert retention(aged, "--days", "30") == 0
    assert "dropped 0 runs" in capsys.readouterr().out
    assert aged.client.get("/api/v1/nodes/node-a", headers=aged.reader).json()["runs"][
        "total"] == 1


def test_retention_reads_the_setting_and_is_off_without_it(aged, capsys, monkeypatch):
    assert retention(aged) == 0
    assert "retention is off" in capsys.readouterr().err
    assert counts(aged)["runs"] == 5

    monkeypatch.setenv("NUMPARITY_RETENTION_DAYS", "90")
    assert retention(aged) == 0  # the runs are 60 days old: all kept
    assert "dropped 0 runs" in capsys.readouterr().out
    monkeypatch.setenv("NUMPARITY_RETENTION_DAYS", "30")
    assert retention(aged) == 0
    assert "dropped 2 runs" in capsys.readouterr().out


@pytest.mark.parametrize("bad", [["--days", "0"], ["--days", "x"], ["--batch-size", "-1"]])
def test_retention_refuses_bad_numbers(bad, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        main(["--database-url", f"sqlite:///{tmp_path / 'x.db'}", "retention", *bad])
    assert exit_info.value.code == 2


def trace_hashes(api) -> set[str]:
    with session_factory(get_engine(api.settings))() as session:
        return set(session.scalars(select(Trace.hash)))


def test_retention_drops_the_traces_no_remaining_result_refers_to(make_api, monkeypatch,
                                                                   capsys):
    """node-a's old run had a trace of its own (another conv kernel) and is no longer its
    latest: that trace goes; the trace node-a's and node-b's latest results share stays."""
    api = make_api()
    monkeypatch.setenv("NUMPARITY_DATABASE_URL", api.settings.database_url)
    shared, own = cnn_trace(), cnn_trace(conv2_kernel="conv:Mkldnn")
    cnn = ("cnn", "default")
    for document in (
        with_traces(run_document("node-a", run_id="a-old", started_at="2026-09-01T08:00:00Z"),
                    {cnn: own}),
        with_traces(run_document("node-a", run_id="a-new", started_at="2026-11-21T08:00:00Z"),
                    {cnn: shared}),
        with_traces(run_document("node-b", run_id="b-old", started_at="2026-09-01T08:00:00Z"),
                    {cnn: shared}),
    ):
        assert api.post_run(document).status_code == 201
    with session_factory(get_engine(api.settings))() as session, session.begin():
        session.execute(update(Run).where(Run.run_id.in_(["a-old", "b-old"]))
                        .values(received_at=utcnow() - timedelta(days=60)))
    assert trace_hashes(api) == {shared["hash"], own["hash"]}

    assert retention(api, "--days", "30", "--dry-run") == 0
    assert "1 op traces" in capsys.readouterr().out
    assert trace_hashes(api) == {shared["hash"], own["hash"]}
    assert retention(api, "--days", "30", "--batch-size", "1") == 0
    out = capsys.readouterr().out
    assert "dropped 1 runs (2 results)" in out and "1 op traces" in out
    assert trace_hashes(api) == {shared["hash"]}


def keep_comparison(api, key: str, hash_a: str, hash_b: str, age_days: float = 0) -> None:
    with session_factory(get_engine(api.settings))() as session, session.begin():
        session.add(KeptComparison(key=key, kind="pair", hash_a=hash_a, hash_b=hash_b,
                                   value={}, awaiting=[],
                                   created_at=utcnow() - timedelta(days=age_days)))


def kept_keys(api) -> set[str]:
    with session_factory(get_engine(api.settings))() as session:
        return set(session.scalars(select(KeptComparison.key)))


def test_retention_drops_comparisons_of_content_gone_or_computed_before_the_cutoff(
        aged, capsys):
    """A kept comparison names its content by hash (manifests, fingerprints, traces): it
    stays while both are stored and it is younger than the cutoff."""
    usual = cnn_tensors()
    answer = manifest_digest([(t["name"], t["kind"], t["hash"]) for t in usual])
    stored = usual[2]["hash"]  # fc1 of the usual answer: node-a's and node-b's latest
    only_old_a = sorted({t["hash"] for t in cnn_tensors(0.5)} - {t["hash"] for t in usual})
    keep_comparison(aged, "k" * 64, answer, stored)
    keep_comparison(aged, "g" * 64, answer, "0" * 64)  # names nothing stored
    keep_comparison(aged, "o" * 64, answer, stored, age_days=45)
    keep_comparison(aged, "d" * 64, answer, only_old_a[0])  # goes with run a-old
    assert retention(aged, "--days", "30", "--dry-run") == 0
    assert "2 kept comparisons" in capsys.readouterr().out
    assert kept_keys(aged) == {"k" * 64, "g" * 64, "o" * 64, "d" * 64}
    assert retention(aged, "--days", "90") == 0
    assert "1 kept comparisons" in capsys.readouterr().out
    assert kept_keys(aged) == {"k" * 64, "o" * 64, "d" * 64}
    assert retention(aged, "--days", "30") == 0
    assert "2 kept comparisons" in capsys.readouterr().out
    assert kept_keys(aged) == {"k" * 64}


def kept_comparisons(api) -> dict[str, str]:
    with session_factory(get_engine(api.settings))() as session:
        return dict(session.execute(select(KeptComparison.key, KeptComparison.hash_b)).all())


def test_what_divergence_kept_goes_with_the_answers_it_compared(aged, capsys):
    """/divergence keeps node-c's own answer (shift 0.25) compared with the usual one. Once
    node-c gives the usual answer, its old run expires, that answer's content goes, and
    so do its comparisons; node-d's (0.75, recent) stays until it is older than the
    cutoff (it is computed again when asked)."""
    for params in ({}, {"tensor": "output"}):
        assert aged.client.get("/api/v1/divergence", headers=aged.reader, params={
            "workload": "cnn", "variant": "default", **params}).status_code == 200
    gone = kept_comparisons(aged)
    assert len(gone) == 2
    for document in (run_document("node-c", run_id="c-new", started_at="2026-11-21T09:00:00Z"),
                     run_document("node-d", run_id="d-new", started_at="2026-11-21T09:00:00Z",
                                  shift=0.75)):
        assert aged.post_run(document).status_code == 201
    assert aged.client.get("/api/v1/divergence", headers=aged.reader, params={
        "workload": "cnn", "variant": "default"}).status_code == 200
    (recent,) = set(kept_comparisons(aged)) - set(gone)

    assert retention(aged, "--days", "30") == 0
    assert "dropped 3 runs" in (out := capsys.readouterr().out)
    assert "2 kept comparisons" in out
    assert set(kept_comparisons(aged)) == {recent}

    with session_factory(get_engine(aged.settings))() as session, session.begin():
        session.execute(update(KeptComparison)
                        .values(created_at=utcnow() - timedelta(days=60)))
    assert retention(aged, "--days", "30", "--dry-run") == 0
    assert "1 kept comparisons" in capsys.readouterr().out
    assert retention(aged, "--days", "30") == 0
    assert "1 kept comparisons" in capsys.readouterr().out
    assert kept_comparisons(aged) == {}


def test_an_outcome_retention_drops_takes_its_empty_counts(aged, capsys):
    """node-a's old answer (shift 0.5) is held by no latest row: its count is 0 and goes
    with the outcome; every other count still equals latest counted again."""
    from numparity_server.models import LatestCount

    def held() -> dict[int, int]:
        with session_factory(get_engine(aged.settings))() as session:
            return dict(session.execute(select(LatestCount.outcome_id, LatestCount.devices)).all())

    before = held()
    assert sorted(before.values()).count(0) == 1  # the old answer, left by node-a
    assert retention(aged, "--days", "30") == 0
    with session_factory(get_engine(aged.settings))() as session:
        outcomes = set(session.scalars(select(Outcome.id)))
    after = held()
    assert set(after) <= outcomes and 0 not in after.values()
    assert after == {outcome: n for outcome, n in before.items() if n}


def environment_keys(api) -> set[str]:
    with session_factory(get_engine(api.settings))() as session:
        return set(session.scalars(select(Environment.env_key)))


def test_retention_drops_environments_nothing_refers_to(make_api, monkeypatch, capsys):
    """A node that sends a new environment with every run (issue 30 finding 4: each one
    stored whole, never deleted) leaves only the environments its kept runs ran on."""
    monkeypatch.delenv("NUMPARITY_RETENTION_DAYS", raising=False)
    api = make_api()
    monkeypatch.setenv("NUMPARITY_DATABASE_URL", api.settings.database_url)
    documents = [run_document("churn", run_id=f"churn-{i}", env_vars={"CHURN": str(i)},
                              started_at=f"2026-09-0{i + 1}T08:00:00Z") for i in range(5)]
    documents.append(run_document("steady", run_id="steady-0"))
    for document in documents:
        assert api.post_run(document).status_code == 201
    keys = {document["environment"]["env_key"] for document in documents}
    assert environment_keys(api) == keys and len(keys) == 6
    with session_factory(get_engine(api.settings))() as session, session.begin():
        session.execute(update(Run).where(Run.run_id.like("churn-%"))
                        .values(received_at=utcnow() - timedelta(days=60)))
        # Found more than the ingest margin ago.
        session.execute(update(Environment).values(first_seen=utcnow() - timedelta(days=60)))
    assert retention(api, "--days", "30", "--dry-run") == 0
    assert "0 environments nothing refers to" in capsys.readouterr().out
    assert retention(api, "--days", "30") == 0
    assert "4 environments nothing refers to" in capsys.readouterr().out
    kept = {documents[4]["environment"]["env_key"], documents[5]["environment"]["env_key"]}
    assert environment_keys(api) == kept
    # The environments left still answer: the node pages and /divergence read them.
    response = api.client.get("/api/v1/divergence", headers=api.reader,
                              params={"workload": "cnn", "variant": "default"})
    assert response.status_code == 200, response.text


def test_two_retentions_at_once_count_each_run_once(make_api, monkeypatch, database_url):
    if database_url.startswith("sqlite"):
        pytest.skip("SQLite's writers take turns: a batch is chosen inside the write lock")
    api = make_api()
    old = [run_document("node-x", run_id=f"x-{day}", started_at=f"2026-09-{day:02d}T08:00:00Z")
           for day in range(1, 6)]
    for document in [*old, run_document("node-x", run_id="x-new")]:
        assert api.post_run(document).status_code == 201
    with session_factory(get_engine(api.settings))() as session, session.begin():
        session.execute(update(Run).where(Run.run_id.in_([d["run_id"] for d in old]))
                        .values(received_at=utcnow() - timedelta(days=60)))
    # Both choose their first batch before either drops it.
    both_chose = threading.Barrier(2, timeout=30)
    choose = retention_repository.expired_run_ids
    first = threading.local()

    def chosen_together(*args, **kwargs):
        batch = choose(*args, **kwargs)
        if not getattr(first, "done", False):
            first.done = True
            both_chose.wait()
        return batch

    monkeypatch.setattr(retention_repository, "expired_run_ids", chosen_together)
    sessions = session_factory(get_engine(api.settings))
    reports = []

    def retention_run() -> None:
        reports.append(apply_retention(sessions=sessions, days=30))

    threads = [threading.Thread(target=retention_run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(reports) == 2
    assert sum(report.runs for report in reports) == len(old)
    assert stored_run_ids(api) == {"x-new"}
