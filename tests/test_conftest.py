"""The shared fixtures as `make test` shows them: the PostgreSQL half of every database
test skips without NUMPARITY_TEST_DATABASE_URL, and says so once, with an example."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = "NUMPARITY_TEST_DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:5432/test"


def test_without_postgresql_the_summary_has_one_skip_line_with_an_example_url() -> None:
    env = {k: v for k, v in os.environ.items()
           if k not in ("NUMPARITY_TEST_DATABASE_URL", "PYTEST_ADDOPTS")}
    # Two modules whose database tests skip for the same reason, as the ~155 of a full run.
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
         "tests/server/health/test_health.py", "tests/server/health/test_server_db_unavailable.py"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    skipped = [line for line in done.stdout.splitlines() if line.startswith("SKIPPED")]
    about_postgresql = [line for line in skipped if "NUMPARITY_TEST_DATABASE_URL" in line]
    assert len(about_postgresql) == 1, skipped
    count = int(re.match(r"SKIPPED \[(\d+)\]", about_postgresql[0]).group(1))
    assert count >= 4  # every PostgreSQL case of both modules, folded into one line
    assert about_postgresql[0].startswith(f"SKIPPED [{count}] tests/conftest.py:")
    assert done.stdout.count(EXAMPLE) == 1
    # A skip of its own reason keeps its own line, at its test.
    assert any("drops a PostgreSQL database" in line for line in skipped)
