"""Fleet-wide reads see one snapshot (design §3.2, "Reads follow writes"): an upload that
commits while `/divergence`, `/audit`, the fleet page or the workload page is reading
never makes it answer 500.

Each test commits a node's move to a new environment (a driver or torch upgrade: a new
answer under a new environment) between two of the read's statements, through a hook on
the statement the read runs second, which is the race of a fleet upgrading while a lab
looks. On PostgreSQL under READ COMMITTED each statement saw its own commits: the second
named an environment or an answer the first had not read (KeyError, ValueError: 500)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import pytest
from helpers.documents import audit_document

from numparity_server.kit.db import get_engine, session_factory
from numparity_server.runs.service import ingest_run

# (route, the module and function its read calls after its first fleet-wide reads, and
# whether the upgrade changes the node's answers or only its environment)
ROUTES = {
    "divergence": ("/api/v1/divergence?workload=cnn&variant=strict",
                   "numparity_server.divergence.repository", "first_members", False),
    "audit": ("/api/v1/audit", "numparity_server.audit.repository", "changed_nodes", True),
    "fleet page": ("/", "numparity_server.dashboard.repository", "node_names", True),
    "workload page": ("/workloads/cnn?tensor=output",
                      "numparity_server.divergence.repository", "first_members", False),
}


@pytest.fixture
def api(make_api):
    # Every request computes (no kept answer), so each reaches the hook.
    api = make_api(read_cache_max_age_s=0, open_reads=True)
    for node in ("peer-1", "peer-2", "peer-3"):
        assert api.post_run(audit_document(node, 3)).status_code == 201
    return api


def upgrade_between(monkeypatch: pytest.MonkeyPatch, api: Any, module: str,
                    function: str, *, step: int, new_answers: bool) -> list[str]:
    """Before the first call of ``module.function``, commit a node's upgrade: a newer run
    under environment variables of its own (with ``new_answers``, whose answers differ).
    Returns the runs committed."""
    target = importlib.import_module(module)
    original: Callable[..., Any] = getattr(target, function)
    committed: list[str] = []

    def hooked(*args: Any, **kwargs: Any) -> Any:
        if not committed:
            document = audit_document(f"peer-{step % 3 + 1}", 2 - step / 10,
                                      shift=1e-3 if new_answers else 0.0,
                                      env_vars={"UPGRADE": str(step)})
            with session_factory(get_engine(api.settings))() as writer:
                ingest_run(session=writer, document=document)
            committed.append(document["run_id"])
        return original(*args, **kwargs)

    monkeypatch.setattr(target, function, hooked)
    return committed


def test_an_upgrade_committed_mid_read_never_fails_the_read(api, monkeypatch):
    failed = {}
    for step, (route, (path, module, function, new_answers)) in enumerate(ROUTES.items()):
        with monkeypatch.context() as hooks:
            committed = upgrade_between(hooks, api, module, function, step=step,
                                        new_answers=new_answers)
            response = api.client.get(path, headers=api.reader)
        assert committed, f"{route} never called {module}.{function}"
        if response.status_code != 200:
            failed[route] = f"{response.status_code}: {response.text[:500]}"
            continue
        # The next read sees the upgrade.
        again = api.client.get(path, headers=api.reader)
        assert again.status_code == 200, again.text[:2000]
        if route == "audit":
            assert again.json()["summary"]["environments"] == 3  # the seed's and 2 upgrades
    assert not failed, failed
