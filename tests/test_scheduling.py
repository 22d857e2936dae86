"""How `make test` shares the suite between xdist's workers (tests/helpers/scheduling.py),
read off a real collection: tests that share a fleet measured once are one group, so one
worker builds it; a test of its own is a unit of its own, so its SQLite and PostgreSQL
cases can run side by side; the group starts before the single tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHOW_GROUPS = '''
import json, os, pytest

@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items):
    seen = []
    for item in items:
        mark = item.get_closest_marker("xdist_group")
        seen.append([item.nodeid, mark.args[0] if mark else None])
    with open(os.environ["SHOW_GROUPS_OUT"], "w") as out:
        json.dump(seen, out)
'''


def collect_groups(tmp_path: Path, *paths: str, hash_seed: str = "random") -> list:
    """[nodeid, xdist group] for each test a real collection of ``paths`` gives, in order."""
    (tmp_path / "show_groups.py").write_text(SHOW_GROUPS)
    out = tmp_path / f"groups-{hash_seed}.json"
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "SHOW_GROUPS_OUT": str(out),
           "PYTHONHASHSEED": hash_seed,
           "NUMPARITY_TEST_DATABASE_URL": "postgresql+psycopg://unused@127.0.0.1:1/x"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "-p", "show_groups", *paths],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(out.read_text())


def test_tests_sharing_a_fleet_are_one_group_and_start_first(tmp_path: Path) -> None:
    seen = collect_groups(tmp_path, "tests/server/health/test_health.py",
                          "tests/e2e/test_fleet.py")
    fleet = [(i, group) for i, (nodeid, group) in enumerate(seen) if "test_fleet.py" in nodeid]
    health = [(i, group) for i, (nodeid, group) in enumerate(seen)
              if "test_health.py" in nodeid]
    assert len(fleet) >= 4 and len(health) >= 4
    # One fleet (a session fixture of the module), one worker: a single group.
    (group,) = {group for _, group in fleet}
    assert group is not None and "fleet_documents" in group
    # The health tests share nothing wider than a test: no group, both databases apart.
    assert {group for _, group in health} == {None}
    assert any(nodeid.endswith("[sqlite]") for nodeid, _ in seen)
    # The group was never measured, so it counts its fixture's minute: it starts first.
    assert max(i for i, _ in fleet) < min(i for i, _ in health)


def test_every_worker_collects_the_same_groups_in_the_same_order(tmp_path: Path) -> None:
    # Each xdist worker is its own interpreter with its own string hash seed; xdist refuses
    # to run ("Different tests were collected") unless all of them name the same groups in
    # the same order. The browser tests share two session fixtures, so the name of their
    # group must not depend on which of the two a set yields first.
    paths = ("tests/browser", "tests/test_packaging.py")
    first, second = (collect_groups(tmp_path, *paths, hash_seed=seed) for seed in ("1", "2"))
    assert any(group for _, group in first)
    assert first == second
