"""User workloads `module:factory` (design §2.2): same interface, failures contained."""

import json
import re
import textwrap
from pathlib import Path

from helpers.agent import clean_env, run_agent

PAGE = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "user-workloads.md"


def test_a_raising_factory_fails_alone_and_the_rest_runs(tmp_path):
    out = tmp_path / "doc.json"
    proc = run_agent(
        "run", "--workloads", "mlp", "agent_test_user_factories:raising",
        "agent_test_user_factories:tiny", "--variants", "default", "strict",
        "--output", str(out),
    )  # fmt: skip
    assert proc.returncode == 4, proc.stderr  # a failed result, the document still written
    doc = json.loads(out.read_text())
    by_key = {(r["workload"], r["variant"]): r for r in doc["results"]}
    assert len(by_key) == 6
    for variant in ("default", "strict"):
        failed = by_key[("agent_test_user_factories:raising", variant)]
        assert failed["status"] == "failed"
        assert failed["error"].splitlines()[0] == "ValueError: the lab's checkpoint is missing"
        assert by_key[("mlp", variant)]["status"] == "ok"
        tiny = by_key[("agent_test_user_factories:tiny", variant)]
        assert tiny["status"] == "ok" and tiny["repeats"] == 2 and tiny["repeats_agree"]
        assert [(t["name"], t["kind"]) for t in tiny["tensors"]] == [
            ("0", "layer"), ("1", "layer"), ("2", "layer"), ("output", "output"),
        ]  # fmt: skip
        assert tiny["input_hash"] and tiny["param_hash"] and "values" in tiny["tensors"][-1]
    assert "ValueError: the lab's checkpoint is missing" in proc.stderr
    strict_tiny = by_key[("agent_test_user_factories:tiny", "strict")]
    assert (
        strict_tiny["input_hash"]
        == by_key[("agent_test_user_factories:tiny", "default")]["input_hash"]
    )


def test_the_manuals_example_runs(tmp_path):
    """The manual's "Write a user workload" example, as a user would copy it."""
    module = re.search(r"```python\n# mylab_workloads.py\n(.*?)```", PAGE.read_text(), re.S)
    assert module, "docs/how-to/user-workloads.md has no mylab_workloads.py example"
    (tmp_path / "mylab_workloads.py").write_text(textwrap.dedent(module.group(1)))
    out = tmp_path / "doc.json"
    env = clean_env()
    env["PYTHONPATH"] = f"{tmp_path}:{env['PYTHONPATH']}"
    proc = run_agent(
        "run", "--workloads", "mylab_workloads:small_classifier", "--variants", "default",
        "fp64-reference", "--output", str(out), env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    default, reference = doc["results"]
    assert default["status"] == reference["status"] == "ok"
    assert default["workload_version"] == 2
    assert default["repeats_agree"] and reference["tensors"][-1]["dtype"] == "float64"
