"""The fleet-wide reads' answers kept against the fleet's version (design §3.2, "Reads
follow writes"): the cache on a fake clock, then through the app — a repeated question
computes nothing, an upload or an `explain` finding makes the next one compute."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from helpers.documents import audit_document

from numparity_server.audit import service as audit_service
from numparity_server.divergence import service as divergence_service
from numparity_server.kit.readcache import ReadCache


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def counting(values: list[str]) -> Any:
    def compute() -> str:
        values.append(f"answer {len(values) + 1}")
        return values[-1]
    return compute


def test_an_answer_is_kept_until_the_version_moves_or_it_grows_old() -> None:
    clock, computed = Clock(), []
    cache = ReadCache(max_age_s=60, clock=clock)
    first = cache.get("audit", (5, 0), counting(computed))
    assert (first.value, first.hit) == ("answer 1", False)
    clock.now += 10
    again = cache.get("audit", (5, 0), counting(computed))
    assert (again.value, again.hit, again.age_s) == ("answer 1", True, 10.0)
    # A newer upload: computed again, at once (fresh_s 0).
    assert cache.get("audit", (6, 0), counting(computed)).value == "answer 2"
    # An explain finding moves the version too.
    assert cache.get("audit", (6, 1), counting(computed)).value == "answer 3"
    # Nothing uploaded for a minute: computed again all the same (the clock moves
    # "stale"; retention deletes without adding a run).
    clock.now += 60
    assert cache.get("audit", (6, 1), counting(computed)).value == "answer 4"
    assert cache.get("other question", (6, 1), counting(computed)).value == "answer 5"


def test_a_few_seconds_of_staleness_bound_the_recomputation_of_a_busy_fleet() -> None:
    clock, computed = Clock(), []
    cache = ReadCache(fresh_s=5, max_age_s=60, clock=clock)
    cache.get("audit", (1,), counting(computed))
    for version in range(2, 8):  # uploads every second
        clock.now += 1
        cache.get("audit", (version,), counting(computed))
    # Once at the start, once when the answer was 5 s old.
    assert computed == ["answer 1", "answer 2"]
    # An answer newer than the version a request saw is served as it is.
    assert cache.get("audit", (3,), counting(computed)).value == "answer 2"


def test_concurrent_askers_wait_for_one_computation() -> None:
    cache, calls, answers = ReadCache(), [], []
    started = threading.Event()

    def slow() -> str:
        calls.append(1)
        started.set()
        time.sleep(0.2)
        return "answer"

    def ask() -> None:
        answers.append(cache.get("divergence", (1,), slow).value)

    threads = [threading.Thread(target=ask) for _ in range(4)]
    threads[0].start()
    started.wait(5)
    for thread in threads[1:]:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert calls == [1] and answers == ["answer"] * 4


def test_the_least_recently_used_answer_goes_first() -> None:
    computed: list[str] = []
    cache = ReadCache(max_entries=2)
    for key in ("a", "b", "a", "c"):
        cache.get(key, (1,), counting(computed))
    assert len(computed) == 3  # "a" asked again while kept
    assert cache.get("a", (1,), counting(computed)).hit
    assert not cache.get("b", (1,), counting(computed)).hit


@pytest.fixture
def calls(monkeypatch) -> dict[str, int]:
    counted = {"audit": 0, "divergence": 0}
    for name, module, attr in (("audit", audit_service, "audit"),
                               ("divergence", divergence_service, "divergence")):
        real = getattr(module, attr)

        def wrapped(*args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
            counted[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, attr, wrapped)
    return counted


def test_a_repeated_question_is_a_lookup_and_an_upload_answers_anew(api, calls) -> None:
    for node in ("peer-1", "peer-2"):
        assert api.post_run(audit_document(node, 2)).status_code == 201
    first = api.client.get("/api/v1/audit", headers=api.reader)
    again = api.client.get("/api/v1/audit", headers=api.reader)
    assert first.status_code == again.status_code == 200 and first.json() == again.json()
    assert calls["audit"] == 1 and again.headers["Age"].isdigit()
    # The page asks the same question (the first page of each list); the CSV, every row,
    # another, asked once too.
    assert api.client.get("/audit", headers=api.reader).status_code == 200
    assert calls["audit"] == 1
    for _ in range(2):
        assert api.client.get("/api/v1/audit", headers=api.reader,
                              params={"format": "csv"}).status_code == 200
    assert calls["audit"] == 2

    assert api.post_run(audit_document("peer-3", 2)).status_code == 201
    after = api.client.get("/api/v1/audit", headers=api.reader).json()
    assert calls["audit"] == 3 and after["summary"]["nodes"] == first.json()["summary"]["nodes"] + 1

    params = {"workload": "cnn", "variant": "strict"}
    for _ in range(2):
        assert api.client.get("/api/v1/divergence", headers=api.reader,
                              params=params).status_code == 200
    assert calls["divergence"] == 1
    assert api.client.get("/api/v1/divergence", headers=api.reader,
                          params={**params, "members_limit": 1}).status_code == 200
    assert calls["divergence"] == 2  # another question


def test_with_read_cache_off_every_view_computes(make_api, calls) -> None:
    api = make_api(read_cache_max_age_s=0)
    assert api.post_run(audit_document("peer-1", 2)).status_code == 201
    for _ in range(2):
        assert api.client.get("/api/v1/audit", headers=api.reader).status_code == 200
    assert calls["audit"] == 2
