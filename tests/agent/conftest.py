import json

import pytest
from helpers.agent import run_agent


@pytest.fixture(scope="session")
def cnn_document(tmp_path_factory):
    """One real `run --output` of cnn under default and strict, 2 threads (the node's)."""
    out = tmp_path_factory.mktemp("run") / "doc.json"
    proc = run_agent(
        "run",
        "--workloads",
        "cnn",
        "--variants",
        "default",
        "strict",
        "--node",
        "node-a",
        "--label",
        "rack=b2",
        "--output",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text())
