"""A real agent's run document goes through the server's schema and ingest unchanged."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from numparity_server.runs.service import validate_document


@pytest.fixture(scope="session")
def agent_document(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    pytest.importorskip("torch")
    out = tmp_path_factory.mktemp("agent")
    path = out / "run.json"
    done = subprocess.run(
        [sys.executable, "-m", "numparity_agent", "run", "--node", "agent-node",
         "--workloads", "cnn", "--variants", "default", "--repeats", "1",
         "--output", str(path), "--spool", str(out / "spool")],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if not Path(path).exists():
        pytest.fail(f"the agent wrote no document (exit {done.returncode}):\n{done.stderr}")
    return json.loads(path.read_text())


def test_agent_document_validates(agent_document):
    run = validate_document(agent_document)
    (result,) = [r for r in run.results if r.variant == "default"]
    assert result.status == "ok" and result.tensors
    assert [t.name for t in result.tensors][-1] == "output"
    assert all(not t.is_bare for t in result.tensors)


def test_agent_document_is_ingested_and_analysed(api, agent_document):
    response = api.post_run(agent_document)
    assert response.status_code == 201, response.text
    assert api.post_run(agent_document).status_code == 200
    report = api.client.get("/api/v1/divergence", params={"workload": "cnn", "variant": "default"},
                            headers=api.reader)
    assert report.status_code == 200, report.text
    assert report.json()["groups"][0]["nodes"] == ["agent-node"]


def test_agent_document_carries_a_timeline_the_schema_reads(agent_document):
    """design §2.7 `timeline`: where each variant child's time went, and each workload's."""
    (child,) = agent_document["timeline"]
    assert child["device"] == "cpu" and child["variants"] == ["default"]
    phases = child["phases"]
    for phase in ("import_s", "build_s", "run_s", "fingerprint_s", "write_s"):
        assert phases[phase] >= 0, phase
    # The phases account for the child's wall time (other_s takes up the rest).
    assert sum(phases.values()) == pytest.approx(child["wall_s"], abs=0.05)
    run = validate_document(agent_document)
    assert run.timeline is not None and run.timeline[0].phases.run_s == phases["run_s"]
    (result,) = run.results
    assert result.timeline is not None and result.timeline.fingerprint_s is not None


@pytest.mark.parametrize(("timeline", "named"), [
    ([{"device": "cpu", "phases": {"run_s": -1.0}}], "run_s"),
    ([{"device": "cpu", "phases": {"run_s": "fast"}}], "run_s"),
    ([{"device": "", "phases": {}}], "device"),
    ({"device": "cpu"}, "timeline"),
])
def test_a_bad_timeline_is_422_naming_it(api, agent_document, timeline, named):
    document = {**agent_document, "run_id": f"bad-timeline-{named}", "timeline": timeline}
    response = api.post_run(document)
    assert response.status_code == 422, response.text
    assert named in response.text
