"""The read cache's version changes with every commit that changes an answer (design
§3.2, "Reads follow writes"): with `read_cache_seconds` 0, every answer is as of the
newest upload, whatever order the uploads' ids and commits came in."""

from __future__ import annotations

import threading

import pytest
from helpers.documents import audit_document
from sqlalchemy import select

from numparity_server.kit.db import get_engine, session_factory
from numparity_server.models import FleetVersion
from numparity_server.runs import service as runs_service
from numparity_server.runs.service import ingest_run


def nodes_in_audit(api) -> int:
    response = api.client.get("/api/v1/audit", headers=api.reader)
    assert response.status_code == 200, response.text
    return int(response.json()["summary"]["nodes"])


def version(api) -> int:
    with session_factory(get_engine(api.settings))() as session:
        return int(session.scalar(select(FleetVersion.version)) or 0)


def test_a_slow_upload_committing_after_a_faster_one_shows_on_the_next_read(
        make_api, monkeypatch, database_url):
    if database_url.startswith("sqlite"):
        pytest.skip("SQLite's writers take turns: its run ids follow the commits")
    api = make_api()  # read_cache_seconds 0: every answer as of the newest upload
    assert api.post_run(audit_document("peer-1", 3)).status_code == 201
    inserted, go_on = threading.Event(), threading.Event()
    store = runs_service._store

    def slow_store(session, run, *args, **kwargs):
        created = store(session, run, *args, **kwargs)
        if run.node.name == "slow":
            inserted.set()  # its run has its id; the commit waits
            assert go_on.wait(30)
        return created

    monkeypatch.setattr(runs_service, "_store", slow_store)
    slow_document = audit_document("slow", 2)  # peer-1's environment and answers
    errors: list[BaseException] = []

    def upload_slowly() -> None:
        try:
            with session_factory(get_engine(api.settings))() as session:
                ingest_run(session=session, document=slow_document)
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    slow = threading.Thread(target=upload_slowly)
    slow.start()
    try:
        assert inserted.wait(30)
        # A faster upload takes a larger id and commits first; a read keeps its answer.
        # (Its environment and answers are its own: the slow upload's rows, uncommitted,
        # would hold it.)
        fast = audit_document("fast", 2, shift=2e-3, env_vars={"FAST": "1"})
        assert api.post_run(fast).status_code == 201
        assert nodes_in_audit(api) == 2
        before = version(api)
    finally:
        go_on.set()
        slow.join(60)
    assert not errors, errors
    # The slow upload's commit (a smaller id than the newest) moves the version ...
    assert version(api) == before + 1
    # ... so the next read computes again: it counts the slow node.
    assert nodes_in_audit(api) == 3


def test_a_token_or_a_kept_comparison_leaves_the_version(api):
    before = version(api)
    from helpers.documents import run_document
    assert api.post_run(run_document("a")).status_code == 201
    assert api.post_run(run_document("b", shift=1e-3)).status_code == 201
    after_uploads = version(api)
    assert after_uploads == before + 2
    # /divergence computes and keeps the comparison of the two answers: no new version.
    response = api.client.get("/api/v1/divergence", headers=api.reader,
                              params={"workload": "cnn", "variant": "default"})
    assert response.status_code == 200, response.text
    assert version(api) == after_uploads
    # Served from the cache: the answer's Age header is there, nothing changed.
    again = api.client.get("/api/v1/divergence", headers=api.reader,
                           params={"workload": "cnn", "variant": "default"})
    assert again.json() == response.json()
