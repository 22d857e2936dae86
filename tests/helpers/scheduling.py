"""How `make test` shares the suite between pytest-xdist's workers (`-n 2 --dist loadgroup`).

Two rules, both taken from the collected items, so a new test needs no marker:

- **Tests that share an expensive fixture run on one worker.** A fixture of a wider scope
  than the function (a fleet measured once, a live server, a built manual) is built once
  per worker that asks for it. The tests that use one such fixture, and transitively the
  fixtures those tests also use, form one ``xdist_group``: a module's fixtures stay the
  module's, a session fixture of a conftest binds the tests of its folder that ask for it.
  A test that uses no such fixture is a unit of its own, so the SQLite and the PostgreSQL
  case of a database test can run side by side.
- **The longest units start first** (longest-processing-time-first): units are ordered by
  the seconds ``tests/durations.json`` measured for their tests (``make test-durations``
  writes it), and xdist is told to keep that order (``--no-loadscope-reorder``). A test not
  in the file counts as the median test, and a group none of whose tests is in it counts
  a minute more for its fixture. The order inside a unit is the collection's, so a
  module's fixture is set up once.

Order is only an optimisation: every test stands alone, in any order (xdist proves it).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
DURATIONS = TESTS / "durations.json"
WIDE_SCOPES = ("class", "module", "package", "session")
# What a group never measured is taken to cost to set up (a fleet, an agent run).
UNMEASURED_SETUP_SECONDS = 60.0
# Wide fixtures cheap enough to build on every worker: no reason to group their tests.
PER_WORKER = frozenset({"database_templates"})
# `make test-fast` (--tier fast): the unit tests. Whole folders of end-to-end tests are
# left out, and any test measured slower than FAST_SECONDS (its setup included).
SLOW_FOLDERS = ("e2e", "browser", "deploy", "docs", "tools", "gpu")
FAST_SECONDS = 1.0


class _Components:
    """Union-find over string keys."""

    def __init__(self) -> None:
        self._parent: dict[str, str] = {}

    def find(self, key: str) -> str:
        self._parent.setdefault(key, key)
        root = key
        while self._parent[root] != root:
            root = self._parent[root]
        while self._parent[key] != root:
            self._parent[key], key = root, self._parent[key]
        return root

    def union(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        for other in keys[1:]:
            self._parent[self.find(other)] = self.find(keys[0])


def _ours(fixturedef: pytest.FixtureDef) -> Path | None:
    """The file under tests/ that defines a fixture, or None for pytest's and plugins'."""
    code = getattr(fixturedef.func, "__code__", None)
    if code is None:
        return None
    path = Path(code.co_filename).resolve()
    return path if path.is_relative_to(TESTS) else None


def shared_fixture_keys(item: pytest.Item) -> set[str]:
    """What ``item`` shares with other tests: one key per instance of a wide fixture."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return set()
    keys = set()
    module = item.nodeid.split("::", 1)[0]
    for name in info.names_closure:
        for fixturedef in info.name2fixturedefs.get(name, ()):
            where = _ours(fixturedef)
            if where is None or fixturedef.scope not in WIDE_SCOPES or name in PER_WORKER:
                continue
            if fixturedef.scope in ("class", "module"):
                # One instance per module that uses it, wherever it is defined.
                keys.add(f"{module}::{name}")
            else:
                # One instance per worker: shared by every test of the suite that uses it.
                keys.add(f"{where.relative_to(TESTS.parent)}::{name}")
    return keys


def load_durations(path: Path = DURATIONS) -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(path.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def plan(items: list[pytest.Item], durations: dict[str, float]) -> dict[str, str]:
    """Group the items (an ``xdist_group`` name per grouped item's nodeid) and reorder
    them in place, longest unit first."""
    components = _Components()
    keys_of = {}
    for item in items:
        keys = shared_fixture_keys(item)
        keys_of[item.nodeid] = keys
        if keys:
            components.union(keys)

    # A component is named by its smallest key: the same in every worker, whatever order
    # its interpreter's string hashing gives a set (xdist refuses workers that disagree).
    names: dict[str, str] = {}
    for keys in keys_of.values():
        for key in keys:
            root = components.find(key)
            names[root] = min(names.get(root, key), key)
    groups: dict[str, str] = {}
    units: dict[str, list[pytest.Item]] = {}
    for item in items:
        keys = keys_of[item.nodeid]
        if keys:
            root = names[components.find(min(keys))]
            groups[item.nodeid] = root
            units.setdefault(f"group:{root}", []).append(item)
        else:
            units.setdefault(f"test:{item.nodeid}", []).append(item)

    default = statistics.median(durations.values()) if durations else 1.0
    seconds = {unit: sum(durations.get(i.nodeid, default) for i in members)
               for unit, members in units.items()}
    for unit, members in units.items():
        if unit.startswith("group:") and not any(i.nodeid in durations for i in members):
            # Never measured: a shared fixture is shared because it is expensive.
            seconds[unit] += UNMEASURED_SETUP_SECONDS
    # sorted() is stable: equal units keep the collection's order.
    order = sorted(units, key=lambda unit: -seconds[unit])
    items[:] = [item for unit in order for item in units[unit]]
    return groups


def group_name(root: str) -> str:
    """A readable xdist group name for a component's root key (no '@', which xdist splits
    on, no '[' and no '::', which pytest parses a nodeid by)."""
    return (root.replace("@", "_").replace("[", "(").replace("]", ")")
            .replace("::", ":"))


def suffix_group(config: pytest.Config, item: pytest.Item, name: str) -> None:
    """Give a grouped test the nodeid xdist's loadgroup schedules by, ``nodeid@group``.

    xdist 3.8 appends the suffix by writing ``item._nodeid``, which pytest 9.1 and later
    no longer read (a node keeps a structured ``NodeId`` in ``_id``): there every group
    would be ignored and a module's fleet built on both workers. So the suffix is set here
    where pytest keeps it; with an older pytest, xdist's own hook still does it."""
    if not getattr(config.option, "loadgroup", False) or not hasattr(item, "_id"):
        return
    from _pytest.nodeid import NodeId

    item._id = NodeId.parse(f"{item.nodeid}@{name}")


def plain_nodeid(nodeid: str) -> str:
    """A report's nodeid without the ``@group`` suffix xdist's loadgroup adds to it."""
    if nodeid.rfind("@") > nodeid.rfind("]"):
        return nodeid.rsplit("@", 1)[0]
    return nodeid


def is_fast(item: pytest.Item, durations: dict[str, float]) -> bool:
    """Whether ``item`` belongs to `make test-fast`'s tier."""
    folder = Path(item.nodeid.split("::", 1)[0]).parts[1:2]
    if folder and folder[0] in SLOW_FOLDERS:
        return False
    if shared_fixture_keys(item):
        return False  # a shared fleet or server: built for a few tests, seconds each
    return durations.get(item.nodeid, 0.0) <= FAST_SECONDS
