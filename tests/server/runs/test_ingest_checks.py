"""A result's self-consistency checks and timing spread on the wire (design §2.2, §2.7):
checks are part of what the result says (its outcome), the spread is timing (its result
row and the latest copy); a malformed check is a 422 naming it."""

from __future__ import annotations

import copy
from typing import Any

from helpers.documents import run_document
from sqlalchemy import select

from numparity_server.kit.db import get_engine, session_factory
from numparity_server.models import Latest, Outcome, Result

CHECKS = {
    "batch_invariant": {"equal": False, "max_ulp": 3, "max_rel": 2.5e-7,
                        "op": "blocks.0.attn.qkv", "requests": [5, 9, 16]},
    "attention_backends_agree": {"equal": True, "max_ulp": 0, "max_rel": 0.0, "op": None,
                                 "backends": {"flash": {"equal": True, "max_ulp": 0,
                                                        "max_rel": 0.0}},
                                 "skipped": {"cudnn": "not compiled"}, "default": "flash"},
}


def with_checks(document: dict[str, Any], checks: dict[str, Any] | None = CHECKS, *,
                spread: float | None = None) -> dict[str, Any]:
    document = copy.deepcopy(document)
    result = document["results"][0]
    if checks is not None:
        result["checks"] = checks
    if spread is not None:
        result["wall_s_spread"] = spread
    return document


def stored(api) -> tuple[dict[tuple[str, str], Any], list[Any], list[Any]]:
    with session_factory(get_engine(api.settings))() as session:
        outcomes = {(o.workload, o.variant): (o.hash, o.checks)
                    for o in session.scalars(select(Outcome))}
        spreads = sorted(session.scalars(select(Result.wall_s_spread)),
                         key=lambda v: (v is None, v))
        latest = sorted(session.scalars(select(Latest.wall_s_spread)),
                        key=lambda v: (v is None, v))
    return outcomes, spreads, latest


def test_checks_are_kept_on_the_outcome_and_the_spread_beside_the_wall_time(api):
    response = api.post_run(with_checks(run_document("node-1"), spread=0.0125))
    assert response.status_code == 201, response.text
    outcomes, spreads, latest = stored(api)
    assert outcomes[("cnn", "default")][1] == CHECKS
    assert outcomes[("cnn", "tf32")][1] is None
    assert spreads == [0.0125, None] and latest == [0.0125, None]


def test_checks_change_the_outcome_hash_only_when_present(api):
    assert api.post_run(run_document("node-1")).status_code == 201
    plain, _, _ = stored(api)
    # Another node, same results with checks: a new outcome for cnn/default only.
    assert api.post_run(with_checks(run_document("node-2"))).status_code == 201
    after, _, _ = stored(api)
    assert len(after) == 2  # keyed by (workload, variant): the newest outcome of each
    with session_factory(get_engine(api.settings))() as session:
        hashes = set(session.scalars(select(Outcome.hash)))
    assert len(hashes) == 3
    assert plain[("cnn", "tf32")] in {(h, None) for h in hashes}
    # A spread alone is timing: no new outcome.
    assert api.post_run(with_checks(run_document("node-3"), None, spread=0.5)).status_code \
        == 201
    with session_factory(get_engine(api.settings))() as session:
        assert len(set(session.scalars(select(Outcome.hash)))) == 3


def test_a_malformed_check_is_refused_with_its_place(api):
    bad = {"batch_invariant": {"equal": "no"}}
    response = api.post_run(with_checks(run_document("node-1"), bad))
    assert response.status_code == 422
    text = str(response.json()["detail"])
    assert "checks" in text and "batch_invariant" in text and "equal" in text
    huge = {"batch_invariant": {"equal": True, "ops": ["x"] * 1000}}
    response = api.post_run(with_checks(run_document("node-1"), huge))
    assert response.status_code == 422 and "500" in str(response.json()["detail"])
    badname = {"Not A Name": {"equal": True}}
    assert api.post_run(with_checks(run_document("node-1"), badname)).status_code == 422
    negative = {"batch_invariant": {"equal": False, "max_ulp": -1}}
    assert api.post_run(with_checks(run_document("node-1"), negative)).status_code == 422
    # Nothing of the refused documents was stored.
    outcomes, _, _ = stored(api)
    assert outcomes == {}
