"""numparity-server: migrate, token create/list/revoke, serve's refusal of SQLite workers."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from helpers.processes import server_command

from numparity_server.cli import main


@pytest.fixture
def cli(database_url, monkeypatch):
    # main() exports --database-url for uvicorn workers; monkeypatch restores it afterwards.
    monkeypatch.setenv("NUMPARITY_DATABASE_URL", database_url)

    def run(*args: str) -> int:
        return main(["--database-url", database_url, *args])

    return run


def test_token_lifecycle(cli, capsys):
    assert cli("token", "list") == 1
    assert "numparity-server migrate" in capsys.readouterr().err
    assert cli("migrate") == 0
    capsys.readouterr()

    assert cli("token", "create", "--role", "agent", "--label", "rack b2") == 0
    out = capsys.readouterr().out
    token = out.strip()
    assert out == token + "\n" and token.startswith("np_") and len(token) > 40

    assert cli("token", "list") == 0
    listing = capsys.readouterr().out
    assert "rack b2" in listing and "agent" in listing and token not in listing

    assert cli("token", "revoke", "1") == 0
    capsys.readouterr()
    assert cli("token", "list") == 0
    assert listing.splitlines()[1] != capsys.readouterr().out.splitlines()[1]  # revoked date
    assert cli("token", "revoke", "99") == 1
    assert "no token with id 99" in capsys.readouterr().err


def test_agent_tokens_bound_to_nodes_are_created_and_listed(cli, capsys):
    assert cli("migrate") == 0
    assert cli("token", "create", "--role", "agent", "--label", "fleet") == 0
    assert "(agent, 'fleet', writes runs of any node)" in capsys.readouterr().err
    assert cli("token", "create", "--role", "agent", "--label", "gpu-01", "--node", "gpu-01",
               "--node", "gpu-01b") == 0
    created = capsys.readouterr()
    assert "(agent, 'gpu-01', bound to gpu-01, gpu-01b); it is shown only once" in created.err
    assert cli("token", "create", "--role", "agent", "--label", "gpus",
               "--node-pattern", "gpu-*", "--node-pattern", "a100-?") == 0
    assert "bound to pattern gpu-*, pattern a100-?" in capsys.readouterr().err
    assert cli("token", "create", "--role", "reader", "--label", "grafana") == 0
    capsys.readouterr()

    assert cli("token", "list") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["ID", "ROLE", "LABEL", "CREATED", "REVOKED", "NODES"]
    rows = {line.split()[0]: line for line in lines[1:]}
    assert rows["1"].endswith("  any node")
    assert rows["2"].endswith("  gpu-01, gpu-01b")
    assert rows["3"].endswith("  pattern gpu-*, pattern a100-?")
    assert rows["4"].endswith("  -")  # a reader token writes no runs
    assert created.out.strip() not in "\n".join(lines)


@pytest.mark.parametrize("role", ["reader", "admin"])
def test_a_node_binding_on_another_role_is_a_usage_error(cli, capsys, role):
    for option in ("--node", "--node-pattern"):
        with pytest.raises(SystemExit) as exit_info:
            cli("token", "create", "--role", role, option, "gpu-01")
        assert exit_info.value.code == 2
        assert (f"--node and --node-pattern bind agent tokens to nodes; a {role} token"
                in capsys.readouterr().err)


def test_the_manuals_per_node_token_loop_binds_one_token_to_each_host(
        migrated_database_url, tmp_path):
    """The shell loop of the manual's "Per-node tokens", run as written."""
    page = (Path(__file__).parents[3] / "docs" / "how-to" / "per-node-tokens.md").read_text()
    (script,) = [block for block in re.findall(r"```sh\n(.*?)```", page, re.DOTALL)
                 if "hosts.txt" in block]
    (tmp_path / "hosts.txt").write_text("gpu-node-1\ngpu-node-2\n")
    bin_dir = Path(server_command()[0]).parent
    env = {**os.environ, "NUMPARITY_DATABASE_URL": migrated_database_url,
           "PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    # The page's loop, then the listing an operator reads to check it (the page may show it).
    script += "\nnumparity-server token list\n"
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    for node in ("gpu-node-1", "gpu-node-2"):
        token_file = tmp_path / "tokens" / f"{node}.token"
        assert token_file.stat().st_mode & 0o777 == 0o600
        assert token_file.read_text().startswith("np_")
        assert re.search(rf"  {node}  .*  {node}$", done.stdout, re.MULTILINE), done.stdout


def test_unknown_role_is_a_usage_error(cli):
    with pytest.raises(SystemExit) as exit_info:
        cli("token", "create", "--role", "root")
    assert exit_info.value.code == 2


def test_serve_refuses_several_workers_on_sqlite(tmp_path, capsys, monkeypatch):
    url = f"sqlite:///{tmp_path / 'x.db'}"
    monkeypatch.setenv("NUMPARITY_DATABASE_URL", url)
    assert main(["serve", "--workers", "4", "--database-url", url]) == 2
    assert "PostgreSQL" in capsys.readouterr().err


def test_a_setting_out_of_its_bounds_is_a_usage_error_naming_its_variable(
        tmp_path, capsys, monkeypatch):
    """As the manual's settings page says: a message naming the variable, no traceback."""
    monkeypatch.setenv("NUMPARITY_PAGE_MAX", "0")
    monkeypatch.setenv("NUMPARITY_OPEN_READS", "perhaps")
    assert main(["--database-url", f"sqlite:///{tmp_path / 'x.db'}", "migrate"]) == 2
    err = capsys.readouterr().err
    assert "error: NUMPARITY_PAGE_MAX='0': Input should be greater than 0" in err
    assert "error: NUMPARITY_OPEN_READS='perhaps'" in err
    assert not (tmp_path / "x.db").exists()


def test_demo_is_delegated(monkeypatch):
    import types

    seen: list[list[str]] = []
    fake = types.SimpleNamespace(main=lambda argv: seen.append(argv) or 0)
    monkeypatch.setitem(__import__("sys").modules, "numparity_server.demo", fake)
    import numparity_server

    monkeypatch.setattr(numparity_server, "demo", fake, raising=False)
    assert main(["demo", "--nodes", "4", "--keep"]) == 0
    assert seen == [["--nodes", "4", "--keep"]]
