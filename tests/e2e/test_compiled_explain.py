"""`explain --target eager` end to end (design §2.11, §2.14): which Inductor setting makes
this node's compiled result give its own eager answer's bits.

The real agent runs two workloads crafted for Inductor (`compiled_workload:crafted`, a
LayerNorm and a softmax whose fused reductions part from eager; `compiled_workload:casts`,
a bfloat16 elementwise chain that eager rounds op by op) eagerly and compiled, and
uploads the run to a live server (SQLite, and PostgreSQL where configured); then
`explain --against RUN --target eager`, through the agent's own CLI and token, tries
Inductor's settings in children and says per workload "restored by X" or "no candidate
restores eager's bits (tried …)", and posts the findings.

What a setting does is asked of torch in a fresh process (`helpers/compiled_oracle.py`:
`torch._inductor.config.patch`, `torch.equal` on every recorded tensor), never assumed:
the expectations come from that oracle on this machine, and every setting explain
claims is put through it again.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.agent import clean_env, run_agent
from helpers.e2e import upload_with_agent

from numparity_agent._compile import INDUCTOR_SETTINGS

# A cold Inductor compile per candidate takes up to minutes on two loaded cores.
pytestmark = pytest.mark.timeout(2400)

HERE = Path(__file__).resolve().parent
ORACLE = HERE.parent / "helpers" / "compiled_oracle.py"
WORKLOADS = ("compiled_workload:crafted", "compiled_workload:casts")
NODE = "lab-compiled-explain"


@pytest.fixture(scope="module")
def agent_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The agent's environment: the test workloads importable, and Inductor's cache the
    CI's (else one of the module), which explain's children keep as a node's own."""
    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or str(
        tmp_path_factory.mktemp("inductor"))
    return clean_env(TORCHINDUCTOR_CACHE_DIR=cache, PYTHONPATH=os.pathsep.join(
        [str(HERE), *clean_env()["PYTHONPATH"].split(os.pathsep)]))


@pytest.fixture(scope="module")
def run_document(tmp_path_factory: pytest.TempPathFactory,
                 agent_env: dict[str, str]) -> Path:
    path = tmp_path_factory.mktemp("compiled-explain") / "run.json"
    done = run_agent("run", "--node", NODE, "--workloads", *WORKLOADS, "--variants",
                     "default", "compiled", "--repeats", "1", "--output", str(path),
                     env=agent_env, timeout=1500)
    assert done.returncode == 0, done.stderr[-4000:]
    return path


def oracle(workload: str, settings: list[dict[str, Any]], env: dict[str, str],
           out: Path) -> dict[str, Any]:
    done = subprocess.run([sys.executable, str(ORACLE), workload, str(out),
                           json.dumps(settings)], env=env, capture_output=True, text=True,
                          timeout=1500, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    answer: dict[str, Any] = json.loads(out.read_text())
    return answer


@pytest.fixture(scope="module")
def restores(tmp_path_factory: pytest.TempPathFactory, agent_env: dict[str, str]
             ) -> dict[str, dict[str, bool]]:
    """Per workload, per single Inductor setting explain may try (each value of
    INDUCTOR_SETTINGS this torch has, but the one in force) and "as configured", whether
    torch.compile then gives eager's bits: torch's answer."""
    tmp = tmp_path_factory.mktemp("oracle")
    singles = [{name: value} for name, values in INDUCTOR_SETTINGS for value in values]
    found: dict[str, dict[str, bool]] = {}
    for index, workload in enumerate(WORKLOADS):
        answer = oracle(workload, [{}, *singles], agent_env, tmp / f"{index}.json")
        defaults = answer["defaults"]
        found[workload] = {
            label(entry["setting"]): entry["restores"] for entry in answer["found"]
            if entry["applies"] and not any(defaults.get(n) == v
                                            for n, v in entry["setting"].items())}
    return found


def label(setting: dict[str, Any]) -> str:
    """A setting as explain names it: `inductor.emulate_precision_casts=true`."""
    if not setting:
        return "as configured"
    return ", ".join(f"inductor.{name}={str(value).lower()}"
                     for name, value in sorted(setting.items()))


def parsed(text: str) -> dict[str, Any]:
    """`inductor.a=true, inductor.b=false` back into {a: True, b: False}."""
    found: dict[str, Any] = {}
    for part in text.split(", "):
        name, _, value = part.removeprefix("inductor.").partition("=")
        found[name] = {"true": True, "false": False}.get(value, value)
    return found


def differs_from_eager(document: dict[str, Any], workload: str) -> bool:
    by_variant = {r["variant"]: {t["name"]: t["hash"] for t in r["tensors"]}
                  for r in document["results"] if r["workload"] == workload}
    return by_variant["compiled"] != by_variant["default"]


def test_explain_names_the_inductor_setting_that_restores_eagers_bits(
        run_document: Path, restores: dict[str, dict[str, bool]],
        agent_env: dict[str, str], live_server: Any, tmp_path: Path) -> None:
    document = json.loads(run_document.read_text())
    run_id = document["run_id"]
    upload_with_agent([run_document], live_server, tmp_path / "spool")
    done = run_agent("explain", "--against", run_id, "--target", "eager", "--node", NODE,
                     "--variants", "compiled", "--max-seconds", "1800",
                     "--server", live_server.base_url, "--token", live_server.agent_token,
                     env=agent_env, timeout=2000)
    print(done.stdout)  # what the user reads, in the report of a failure
    assert done.returncode == 0, done.stderr[-4000:]
    assert "findings uploaded" in done.stderr
    lines = {line.split(": ", 1)[0]: line for line in done.stdout.splitlines()}
    eager = f"eager's bits (run {run_id}'s default result)"
    expected_status = {}
    for workload in WORKLOADS:
        line = lines[f"{workload}/compiled"]
        torch_says = restores[workload]
        assert torch_says["as configured"] is not differs_from_eager(document, workload)
        if torch_says["as configured"]:
            assert line == f"{workload}/compiled: already gives {eager} as configured"
            expected_status[workload] = ("already", None)
            continue
        claimed = re.search(rf"{re.escape(eager)} restored by (.+) \(tried \d+ ", line)
        restoring = [name for name, yes in torch_says.items() if yes]
        if claimed is None:
            # Nothing restores: then torch agrees of every single setting, and the line
            # names each of them as tried.
            assert not restoring, (line, torch_says)
            assert line.startswith(f"{workload}/compiled: no candidate restores {eager} "
                                   "(tried "), line
            singles = [parsed(single) for single in torch_says if single != "as configured"]
            for single in singles[:12]:  # the sentence names the first 12 tried
                assert label(single) in line, (single, line)
            # Nor does any pair of them, torch says (compiled from the cache explain's
            # children filled: the same graphs under the same settings).
            pairs = [{**a, **b} for i, a in enumerate(singles) for b in singles[i + 1:]
                     if not set(a) & set(b)]
            found = oracle(workload, pairs, agent_env, tmp_path / "pairs.json")["found"]
            assert not any(entry.get("restores") for entry in found), found
            expected_status[workload] = ("not_reproduced", None)
            continue
        setting = claimed.group(1)
        if setting in torch_says:
            # A single: the first torch says restores, in explain's order of trying.
            assert setting == restoring[0], (line, torch_says)
        else:
            # A pair, tried only once no single restored: torch is asked about it.
            assert not restoring, (line, torch_says)
            (again,) = oracle(workload, [parsed(setting)], agent_env,
                              tmp_path / "pair.json")["found"]
            assert again["restores"], (line, again)
        expected_status[workload] = ("reproduced", setting)

    # The server lists them as eager-target findings against the node's own run, and
    # never beside a split between nodes.
    answer = httpx.get(f"{live_server.base_url}/api/v1/explanations",
                       params={"node": NODE, "target": "eager"},
                       headers=live_server.headers("reader"), timeout=60)
    assert answer.status_code == 200, answer.text
    found = {item["workload"]: item for item in answer.json()["items"]}
    assert set(found) == set(WORKLOADS)
    for workload, (status, setting) in expected_status.items():
        item = found[workload]
        assert (item["target"], item["against_run"], item["against_node"], item["variant"],
                item["device"], item["status"], item["label"]) == (
            "eager", run_id, NODE, "compiled", "cpu", status, setting)
    others = httpx.get(f"{live_server.base_url}/api/v1/explanations",
                       params={"node": NODE, "target": "run"},
                       headers=live_server.headers("reader"), timeout=60)
    assert others.json()["items"] == []

    # Beside each compiled verdict, on the API and the node page.
    view = httpx.get(f"{live_server.base_url}/api/v1/runs/{run_id}/compiled",
                     headers=live_server.headers("reader"), timeout=300)
    assert view.status_code == 200, view.text
    for item in view.json()["items"]:
        status, setting = expected_status[item["workload"]]
        assert (item["restores_eager"]["status"], item["restores_eager"]["label"]) == (
            status, setting)
    page = httpx.get(f"{live_server.base_url}/nodes/{NODE}",
                     headers=live_server.headers("reader"), timeout=300)
    assert page.status_code == 200
    for status, setting in expected_status.values():
        assert f'data-restores="{status}">' + (f"<code>{setting}</code>" if setting else "") \
            in page.text
