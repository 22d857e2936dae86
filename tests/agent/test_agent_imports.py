"""The agent installs into ML environments: it stays light and server-free (design §1)."""

import subprocess
import sys

from helpers.agent import clean_env

CHECK = """
import sys
import numparity_agent, numparity_agent._cli, numparity_agent._suite
assert "torch" not in sys.modules, "the CLI's parent process must not import torch"
import numparity_agent.testing
assert "torch" not in sys.modules, "a bench that only spools and uploads needs no torch"
import numparity_agent._child, numparity_agent._runner, numparity_agent._workloads.cnn
from numparity_agent import Built, Recorder, Workload, capture_environment, fingerprint, run_suite
bad = [m for m in sys.modules if m.split(".")[0] in ("fastapi", "sqlalchemy", "numparity_server")]
assert not bad, bad
"""


def test_agent_imports_neither_torch_eagerly_nor_the_server():
    proc = subprocess.run(
        [sys.executable, "-c", CHECK],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
