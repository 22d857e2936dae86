"""numparity-server: migrate, token create/list/revoke, serve's refusal of SQLite workers."""

from __future__ import annotations

import pytest

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


def test_unknown_role_is_a_usage_error(cli):
    with pytest.raises(SystemExit) as exit_info:
        cli("token", "create", "--role", "root")
    assert exit_info.value.code == 2


def test_serve_refuses_several_workers_on_sqlite(tmp_path, capsys, monkeypatch):
    url = f"sqlite:///{tmp_path / 'x.db'}"
    monkeypatch.setenv("NUMPARITY_DATABASE_URL", url)
    assert main(["serve", "--workers", "4", "--database-url", url]) == 2
    assert "PostgreSQL" in capsys.readouterr().err


def test_demo_is_delegated(monkeypatch):
    import types

    seen: list[list[str]] = []
    fake = types.SimpleNamespace(main=lambda argv: seen.append(argv) or 0)
    monkeypatch.setitem(__import__("sys").modules, "numparity_server.demo", fake)
    import numparity_server

    monkeypatch.setattr(numparity_server, "demo", fake, raising=False)
    assert main(["demo", "--nodes", "4", "--keep"]) == 0
    assert seen == [["--nodes", "4", "--keep"]]
