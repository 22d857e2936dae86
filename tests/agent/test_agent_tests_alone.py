"""The agent's tests run where only the agent is installed: a node, or a lab's GPU
machine, with `pip install 'numparity[agent]'` and pytest, without the server's
packages (FastAPI, SQLAlchemy, psycopg, pydantic …). tests/helpers/agent_alone makes
them unimportable in a child pytest; plugins are not autoloaded there (schemathesis,
a dev dependency, would import them)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ALONE = ROOT / "tests" / "helpers" / "agent_alone"


def _pytest(*args: str, alone: bool) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    if alone:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ALONE),
                                                          env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=400, check=False,
    )  # fmt: skip


def _collected(done: subprocess.CompletedProcess[str]) -> list[str]:
    return sorted(line for line in done.stdout.splitlines() if "::" in line)


def test_without_the_server_packages_every_agent_test_is_collected() -> None:
    alone = _pytest("--collect-only", "tests/agent", alone=True)
    assert alone.returncode == 0, alone.stdout[-4000:] + alone.stderr[-4000:]
    everything = _pytest("--collect-only", "tests/agent", alone=False)
    assert everything.returncode == 0, everything.stdout[-4000:]
    assert _collected(alone) == _collected(everything)
    assert len(_collected(alone)) > 100


def test_without_the_server_packages_agent_tests_pass_and_server_tests_say_why() -> None:
    done = _pytest(
        "tests/agent/test_agent_fingerprint.py",
        # a real `numparity-agent run --output` in a child process
        "tests/agent/test_agent_run.py::test_output_writes_a_run_document_with_both_variants",
        # needs a live server: skipped, naming what is missing
        "tests/agent/test_agent_operations_live.py::test_a_cron_run_with_no_environment_at_all",
        alone=True,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    summary = done.stdout.strip().splitlines()[-1]
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed.group(1)) >= 5, summary
    assert "failed" not in summary and "error" not in summary, summary
    skips = [line for line in done.stdout.splitlines() if line.startswith("SKIPPED")]
    assert any("the server's packages" in line and "sqlalchemy" in line for line in skips), \
        done.stdout[-3000:]
