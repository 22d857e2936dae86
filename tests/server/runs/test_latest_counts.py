"""``latest_counts`` stays what counting ``latest`` gives, whatever uploads arrive.

The oracle counts the ``latest`` rows again in Python (devices, the first node name in
code point order, the wall time sums in float64) after every upload; the counts the
fleet-wide reads use must equal it."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

import pytest
from helpers.documents import at, gpu_document, run_document
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from numparity_server.kit.db import create_engine_for, get_engine, session_factory
from numparity_server.kit.settings import Settings
from numparity_server.models import Latest, LatestCount, Node
from numparity_server.runs import counts

MKL = {"MKL_CBWR": "COMPATIBLE"}


def counted(session: Session) -> dict[tuple[int, int, str], dict[str, Any]]:
    """The counts as stored: every count with rows, and none that is not all zero."""
    found = {}
    for row in session.execute(select(LatestCount)).scalars():
        values = {"devices": row.devices, "first_node": row.first_node,
                  "walls": row.walls, "spreads": row.spreads, "wall_sum": row.wall_sum,
                  "wall_sq_sum": row.wall_sq_sum, "spread_sum": row.spread_sum,
                  "key": (row.suite, row.workload, row.variant)}
        if row.devices:
            found[(row.environment_id, row.outcome_id, row.model)] = values
        else:  # an empty count keeps no name and no residue of its sums
            assert (row.first_node, row.walls, row.spreads, row.wall_sum, row.wall_sq_sum,
                    row.spread_sum) == (None, 0, 0, 0.0, 0.0, 0.0)
    return found


def recounted(session: Session) -> dict[tuple[int, int, str], dict[str, Any]]:
    """``latest`` counted again, in Python."""
    found: dict[tuple[int, int, str], dict[str, Any]] = {}
    rows = session.execute(select(Latest, Node.name).join(Node, Node.id == Latest.node_id))
    for latest, name in rows:
        entry = found.setdefault((latest.environment_id, latest.outcome_id, latest.model), {
            "devices": 0, "first_node": name, "walls": 0, "spreads": 0, "wall_sum": 0.0,
            "wall_sq_sum": 0.0, "spread_sum": 0.0,
            "key": (latest.suite, latest.workload, latest.variant)})
        entry["devices"] += 1
        entry["first_node"] = min(entry["first_node"], name)
        if latest.wall_s is not None:
            entry["walls"] += 1
            entry["wall_sum"] += latest.wall_s
            entry["wall_sq_sum"] += latest.wall_s ** 2
        if latest.wall_s_spread is not None:
            entry["spreads"] += 1
            entry["spread_sum"] += latest.wall_s_spread
    return found


def assert_counts_match(sessions: Callable[[], Session]) -> None:
    with sessions() as session:
        stored, expected = counted(session), recounted(session)
    assert stored.keys() == expected.keys()
    for key, want in expected.items():
        got = stored[key]
        for name in ("devices", "first_node", "walls", "spreads", "key"):
            assert got[name] == want[name], (key, name)
        for name in ("wall_sum", "wall_sq_sum", "spread_sum"):
            assert math.isclose(got[name], want[name], rel_tol=1e-12, abs_tol=1e-12), (key, name)


def timed(document: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """Wall times (and spreads) on every ok result, some left out."""
    for result in document["results"]:
        if result["status"] == "ok" and rng.random() < 0.8:
            result["wall_s"] = rng.uniform(0.01, 2.0)
            result["wall_s_spread"] = rng.uniform(0.0, 0.1) if rng.random() < 0.5 else None
        else:
            result.pop("wall_s", None)
    return document


def test_counts_follow_latest_through_every_kind_of_upload(api):
    rng = random.Random(7)
    sessions = session_factory(get_engine(api.settings))
    variants = ("default", "strict")
    uploads = [
        # Three peers, one answer; b and c also under strict.
        *(run_document(name, started_at=at(10), variants=variants) for name in "abc"),
        run_document("b", started_at=at(9), variants=variants, shift=1e-3),  # b changes
        run_document("a", started_at=at(20), shift=5e-1),  # a spooled run, too old to count
        run_document("c", started_at=at(8), variants=variants, env_vars=MKL),  # c upgrades
        # a, the first name of its counts, changes its answer: the name is b's or none.
        run_document("a", started_at=at(7), variants=variants, shift=2e-3),
        run_document("b", started_at=at(6), variants=variants),  # b comes back
        run_document("a", started_at=at(5), variants=("default",)),  # strict left as is
        # A node with two GPUs, one computing wrong; then one GPU is gone from it.
        gpu_document("g", 4, ["GPU-1", "GPU-2"], shifted={"GPU-2": 1e-3}),
        gpu_document("g", 3, ["GPU-1"], visible=["GPU-1"]),
        # The second GPU shows up on another node (it moved).
        gpu_document("h", 2, ["GPU-2"]),
        run_document("b", started_at=at(1), variants=variants),  # same answers, new times
    ]
    for document in uploads:
        assert api.post_run(timed(document, rng)).status_code == 201
        assert_counts_match(sessions)
    with sessions() as session:
        by_outcome = {key: entry["devices"] for key, entry in counted(session).items()}
        # The fleet kept its last state: both GPUs counted once, on g and on h.
        assert sum(by_outcome.values()) == session.scalar(
            select(func.count()).select_from(Latest))
        # What rebuild counts from scratch is what ingest kept.
        before = counted(session)
        counts.rebuild(session)
        session.commit()
        assert counted(session) == before


def test_the_first_name_is_found_again_when_its_node_leaves(api):
    """Ten nodes of one answer leave it in name order: each time the next name is the
    count's first, read from ``latest``."""
    sessions = session_factory(get_engine(api.settings))
    names = [f"node-{i:02d}" for i in range(10)]
    for name in reversed(names):
        assert api.post_run(run_document(name, started_at=at(10))).status_code == 201
    for index, name in enumerate(names[:-1]):
        assert api.post_run(run_document(name, started_at=at(5), shift=1e-3)).status_code == 201
        with sessions() as session:
            kept = session.scalar(  # the outcome the last node still holds
                select(Latest.outcome_id).join(Node, Node.id == Latest.node_id)
                .where(Node.name == names[-1], Latest.variant == "default"))
            usual = [row for (_env, outcome, _model), row in counted(session).items()
                     if outcome == kept]
            assert [(row["devices"], row["first_node"]) for row in usual] == [
                (len(names) - index - 1, names[index + 1])]
    assert_counts_match(sessions)


@pytest.mark.parametrize("rounds", [3])
def test_concurrent_uploads_keep_the_counts(rounds, live_server, migrated_database_url):
    """Many nodes of one environment upload at once, changing answers back and forth: the
    uploads share count rows (on PostgreSQL, concurrently)."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    rng = random.Random(11)
    names = [f"n{i:02d}" for i in range(16)]

    def upload(document: dict[str, Any]) -> int:
        with httpx.Client(base_url=live_server.base_url, headers=live_server.headers("agent"),
                          timeout=120) as client:
            return client.post("/api/v1/runs", json=document).status_code

    for round_ in range(rounds):
        documents = [timed(run_document(name, started_at=at(10 - round_),
                                        variants=("default", "strict"),
                                        shift=1e-3 * rng.randrange(3)), rng)
                     for name in names]
        with ThreadPoolExecutor(8) as pool:
            assert list(pool.map(upload, documents)) == [201] * len(names), live_server.log()
    engine = create_engine_for(Settings(database_url=migrated_database_url), pooled=False)
    try:
        assert_counts_match(session_factory(engine))
    finally:
        engine.dispose()
