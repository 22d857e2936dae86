"""The lab's policy file: rules, tolerances, and clear errors for a file that is wrong."""

from __future__ import annotations

import pytest

from numparity_server.analysis.policy import Policy, PolicyError, parse_policy
from numparity_server.analysis.tolerance import Tolerance, default_tolerance
from numparity_server.cli import main
from numparity_server.kit.policy_file import load_policy

POLICY = """
stale_after_hours = 6
min_peers = 4

[allowed]
"torch.version" = ["2.13.*", "2.12.1"]

[required]
"knobs.deterministic_algorithms" = false

[tolerances]
float32 = {rtol = 1e-5, atol = 1e-6}

[tolerances.workloads.transformer]
rtol = 1e-3
atol = 1e-4

[tolerances.workloads.cnn]
bfloat16 = {rtol = 0.05, atol = 1e-3}
"""


@pytest.fixture
def policy(tmp_path) -> Policy:
    path = tmp_path / "policy.toml"
    path.write_text(POLICY)
    return load_policy(path)


def test_settings_and_rules(policy):
    assert policy.stale_after_hours == 6 and policy.min_peers == 4
    ok = {"torch.version": "2.13.0+cpu", "knobs.deterministic_algorithms": "false"}
    assert policy.violations(ok) == []
    found = policy.violations({"torch.version": "2.11.0",
                               "knobs.deterministic_algorithms": "true"})
    assert [(v.attribute, v.value, v.rule) for v in found] == [
        ("torch.version", "2.11.0", "allowed"),
        ("knobs.deterministic_algorithms", "true", "required")]
    # An attribute the environment does not have is "unset", as attribution shows it.
    assert policy.violations({"knobs.deterministic_algorithms": "false"})[0].value == "unset"


def test_the_version_is_the_policys_content(policy, tmp_path):
    """/divergence keeps comparisons under the policy's version: the same content is the
    same version, another tolerance another one."""
    again = tmp_path / "again.toml"
    again.write_text(POLICY)
    assert load_policy(again).version == policy.version
    assert len(policy.version) == 64 and policy.version != Policy().version
    looser = tmp_path / "looser.toml"
    looser.write_text(POLICY.replace("rtol = 1e-3", "rtol = 2e-3"))
    assert load_policy(looser).version != policy.version
    assert Policy().version == Policy().version


def test_tolerances_per_workload_then_dtype_then_default(policy):
    assert policy.tolerance("transformer", "float32") == Tolerance(rtol=1e-3, atol=1e-4)
    assert policy.tolerance("cnn", "bfloat16") == Tolerance(rtol=0.05, atol=1e-3)
    assert policy.tolerance("cnn", "float32") == Tolerance(rtol=1e-5, atol=1e-6)
    assert policy.tolerance("mlp", "torch.float16") == default_tolerance("float16")
    assert Policy().tolerance("mlp", "float32") == default_tolerance("float32")


@pytest.mark.parametrize(("raw", "message"), [
    ({"stale_hours": 3}, "unknown setting(s) stale_hours"),
    ({"min_peers": 0}, "min_peers: expected a number >= 1"),
    ({"min_peers": 2.5}, "min_peers: expected a whole number"),
    ({"tolerances": {"float33": {"rtol": 1}}}, "unknown dtype 'float33'"),
    ({"tolerances": {"float32": {"rtol": -1}}}, "tolerances.float32.rtol"),
    ({"tolerances": {"workloads": {"cnn": {"rtol": "big"}}}}, "tolerances.workloads.cnn.rtol"),
    ({"allowed": {"torch.version": [{"x": 1}]}}, "allowed.torch.version"),
])
def test_what_is_wrong_is_named(raw, message):
    with pytest.raises(PolicyError, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace(".", r"\.").replace("*", r"\*")):
        parse_policy(raw)


def test_a_bad_file_stops_serve_with_a_message(tmp_path, capsys, monkeypatch):
    # serve exports both for uvicorn's workers; monkeypatch takes them back afterwards.
    # (delenv of an unset variable records nothing to undo: set it first.)
    for name in ("NUMPARITY_POLICY_FILE", "NUMPARITY_DATABASE_URL"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    path = tmp_path / "policy.toml"
    path.write_text("stale_after_hours = [\n")
    assert main(["serve", "--database-url", f"sqlite:///{tmp_path}/db.sqlite",
                 "--policy", str(path)]) == 2
    assert f"policy file {path} is not valid TOML" in capsys.readouterr().err
    assert main(["serve", "--database-url", f"sqlite:///{tmp_path}/db.sqlite",
                 "--policy", str(tmp_path / "missing.toml")]) == 2
    assert "missing.toml: No such file or directory" in capsys.readouterr().err
