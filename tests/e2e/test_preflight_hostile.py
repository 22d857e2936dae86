"""Preflight against hostile nodes (issue "A preflight no single node can switch off, turn
against the fleet, or use to run code on every node").

Three honest nodes upload a real agent's cnn/strict result; nodes with agent tokens
bound to them each try one trick through the live server (SQLite and PostgreSQL):
- `evil-version` claims the next workload version, `evil-repeats` that its repeats
  disagree, `evil-uuids` another answer on four devices with invented UUIDs;
- `user-a` and `user-b` agree on keys no node of the suite runs: `tempfile:mkdtemp` and
  `os:abort` as workloads, an unknown variant.
The real `numparity-agent check` of an honest node is then a go against the honest
answer and imports nothing the plan names (no directory appears in its TMPDIR, no child
aborts, no traceback). A pin
taken from the majority holds the honest answer, says which nodes held it and leaves the
one-node keys out. When the nodes then split evenly, the plan names the split key and a
drilled node's check cannot tell (exit 11), never a go, with or without `--fail-open`.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.agent import clean_env, run_agent
from helpers.e2e import upload_with_agent

pytestmark = pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two cores")

HONEST = ("honest-1", "honest-2", "honest-3")
TIED = ("tie-1", "tie-2", "tie-3")
# What is tested is the verdict, not the speed (test_preflight.py holds `check` to the
# manual's 60 s): room for a loaded CI machine, where the environment's child alone took
# 40 s.
BUDGET_S = 180


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One real run of cnn/strict on this machine: every honest node's document."""
    path = tmp_path_factory.mktemp("hostile") / "honest.json"
    done = run_agent("run", "--node", HONEST[0], "--workloads", "cnn", "--variants", "strict",
                     "--repeats", "1", "--output", str(path), env=clean_env(), timeout=600)
    assert done.returncode == 0, done.stderr
    document: dict[str, Any] = json.loads(path.read_text())
    return document


def _as_node(document: dict[str, Any], node: str) -> dict[str, Any]:
    copied = copy.deepcopy(document)
    copied["node"]["name"] = node
    copied["run_id"] = str(uuid.uuid4())
    return copied


def _renamed(result: dict[str, Any], tag: str) -> dict[str, Any]:
    """The result with its last tensor renamed: another manifest, the same bytes."""
    changed = copy.deepcopy(result)
    changed["tensors"][-1]["name"] += tag
    return changed


def _upload(server: Any, token: str, documents: list[dict[str, Any]]) -> None:
    """POST each document with the node's token, as a node's own script could."""
    for document in documents:
        response = httpx.post(f"{server.base_url}/api/v1/runs", json=document,
                              headers={"Authorization": f"Bearer {token}"}, timeout=60)
        assert response.status_code == 201, response.text


def _tokens(server: Any, bindings: dict[str, dict[str, Any]]) -> dict[str, str]:
    """label → an agent token bound as ``bindings`` says (node_names, node_patterns)."""
    from numparity_server.auth.service import create_token
    from numparity_server.kit.db import get_engine, session_factory
    from numparity_server.kit.settings import Settings

    with session_factory(get_engine(Settings(database_url=server.database_url)))() as session:
        return {label: create_token(session=session, role="agent", label=label,
                                    **binding).token
                for label, binding in bindings.items()}


def _check(server: Any, token: str, tmpdir: Path, *args: str
           ) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    tmpdir.mkdir(exist_ok=True)
    done = run_agent("check", "--server", server.base_url, "--max-seconds", str(BUDGET_S),
                     "--json", *args,
                     env={**clean_env(), "NUMPARITY_TOKEN": token, "TMPDIR": str(tmpdir)},
                     timeout=BUDGET_S + 30)
    assert "Traceback" not in done.stderr, done.stderr
    return done, json.loads(done.stdout)


def test_one_node_cannot_switch_off_turn_or_run_code_through_the_check(
        measured: dict[str, Any], live_server: Any, tmp_path: Path) -> None:
    (honest_result,) = [r for r in measured["results"] if r["status"] == "ok"]
    tokens = _tokens(live_server, {
        "honest": {"node_patterns": ["honest-*"]},
        **{name: {"node_names": [name]}
           for name in ("evil-version", "evil-repeats", "evil-uuids")},
        "users": {"node_patterns": ["user-*"]}, "tied": {"node_patterns": ["tie-*"]}})
    # The honest nodes upload with the agent's own flush.
    folder = tmp_path / "honest"
    folder.mkdir()
    for node in HONEST:
        (folder / f"{node}.json").write_text(json.dumps(_as_node(measured, node)))
    upload_with_agent(sorted(folder.iterdir()), live_server, tmp_path / "spool",
                      token=tokens["honest"])

    newer = _as_node(measured, "evil-version")
    newer["results"][0]["workload_version"] += 1
    unsteady = _as_node(measured, "evil-repeats")
    unsteady["results"][0]["repeats_agree"] = False
    invented = _as_node(measured, "evil-uuids")
    invented["devices"] = [{"device": f"cpu:{i}", "type": "cpu",
                            "uuid": f"GPU-{uuid.uuid4()}"} for i in range(4)]
    invented["results"] = [{**_renamed(honest_result, "-evil"), "device": f"cpu:{i}"}
                           for i in range(4)]
    _upload(live_server, tokens["evil-version"], [newer])
    _upload(live_server, tokens["evil-repeats"], [unsteady])
    _upload(live_server, tokens["evil-uuids"], [invented])

    exotic = [{**copy.deepcopy(honest_result), "workload": "tempfile:mkdtemp"},
              {**copy.deepcopy(honest_result), "workload": "os:abort"},
              {**copy.deepcopy(honest_result), "variant": "no-such-variant"}]
    users = []
    for node in ("user-a", "user-b"):
        document = _as_node(measured, node)
        document["results"] = copy.deepcopy(exotic)
        users.append(document)
    _upload(live_server, tokens["users"], users)

    # An honest node: a go against the honest answer; nothing the plan names is imported.
    tmpdir = tmp_path / "tmp-check"
    done, report = _check(live_server, tokens["honest"], tmpdir)
    assert done.returncode == 0, done.stdout + done.stderr
    (device,) = report["devices"]
    answers = {(a["workload"], a["variant"]): a for a in device["answers"]}
    assert answers[("cnn", "strict")]["status"] == "match"
    assert answers[("cnn", "strict")]["source"] == "fleet"
    for key in (("tempfile:mkdtemp", "strict"), ("os:abort", "strict"),
                ("cnn", "no-such-variant")):
        assert answers[key]["status"] == "unchecked", answers
        assert "not run" in answers[key]["detail"]
    assert list(tmpdir.iterdir()) == []  # tempfile.mkdtemp never ran

    # A pin from the majority holds the honest answer, held by several named nodes; what
    # one node alone holds is left out, with why.
    response = httpx.post(f"{live_server.base_url}/api/v1/goldens",
                          headers=live_server.headers("admin"),
                          json={"source": "majority", "node": HONEST[0],
                                "workloads": ["cnn"], "reason": "after the attack"},
                          timeout=60)
    assert response.status_code == 201, response.text
    pinned = response.json()
    (answer,) = [a for a in pinned["answers"] if a["variant"] == "strict"]
    assert answer["workload_version"] == honest_result["workload_version"]
    assert answer["holders"] >= 3 and set(HONEST) <= set(answer["held_by"])
    assert "evil-uuids" not in answer["held_by"]
    unpinned = httpx.post(f"{live_server.base_url}/api/v1/goldens/{pinned['id']}/unpin",
                          headers=live_server.headers("admin"), json={"reason": "test"},
                          timeout=60)
    assert unpinned.status_code == 201, unpinned.text

    # The nodes split evenly: the plan names the split key, and a drilled node cannot
    # tell (11), never a go, even with --fail-open.
    tied = [_as_node(measured, node) for node in TIED]
    for document in tied:
        document["results"] = [_renamed(honest_result, "-tie")]
    _upload(live_server, tokens["tied"], tied)
    done, report = _check(live_server, tokens["honest"], tmp_path / "tmp-tie",
                          "--fault-drill", "--fail-open")
    assert done.returncode == 11, done.stdout + done.stderr
    (device,) = report["devices"]
    answers = {(a["workload"], a["variant"]): a for a in device["answers"]}
    assert answers[("cnn", "strict")]["status"] == "unchecked"
    assert "split without a majority" in answers[("cnn", "strict")]["detail"]
