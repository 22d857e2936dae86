"""The reference pages generated from the code (docs/_gen/reference.py, `make docs-ref`):
the committed pages are what the code gives now, the generator reads the code (a flag or
setting added in-process shows up, and the check fails), and every flag, setting, agent
config key and exit code has words a user can read."""

from __future__ import annotations

import argparse
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from helpers.manual import DOCS, reference_generator
from pydantic import Field

from numparity_agent import _cli, _config
from numparity_server import cli as server_cli
from numparity_server.kit import settings as server_settings


@pytest.fixture(scope="module")
def gen() -> ModuleType:
    return reference_generator()


@pytest.fixture
def docs_copy(tmp_path: Path) -> Path:
    """docs/reference as committed, in a folder of its own."""
    shutil.copytree(DOCS / "reference", tmp_path / "reference")
    return tmp_path


def test_the_committed_reference_is_what_the_code_gives(gen: ModuleType) -> None:
    assert set(gen.PAGES) >= {"reference/cli-agent.md", "reference/cli-server.md",
                              "reference/settings.md", "reference/exit-codes.md",
                              "reference/metrics.md", "reference/api-operations.md"}
    stale = gen.stale_pages(DOCS)
    assert not stale, (f"docs/{', docs/'.join(stale)}: not what the code gives now; run "
                       "`make docs-ref` and commit the result")


def test_what_is_written_by_hand_around_the_generated_part_is_kept(
        gen: ModuleType, docs_copy: Path) -> None:
    """The README's prose moves into these pages: regenerating must not lose it."""
    page = docs_copy / "reference" / "exit-codes.md"
    title, rest = page.read_text(encoding="utf-8").split("\n", 1)
    page.write_text(f"{title}\n\nWhat the operator does, by hand.\n{rest}\nAfter it.\n",
                    encoding="utf-8")
    generated = gen.exit_codes_page()
    page.write_text(page.read_text(encoding="utf-8").replace("| `0` | ok", "| `0` | OK?"),
                    encoding="utf-8")
    assert gen.stale_pages(docs_copy) == ["reference/exit-codes.md"]
    assert gen.main(["--docs", str(docs_copy)]) == 0
    text = page.read_text(encoding="utf-8")
    assert text.startswith("# Exit codes\n\nWhat the operator does, by hand.\n")
    assert text.endswith("\nAfter it.\n") and generated in text and "OK?" not in text
    # Without its markers the page is not overwritten: the error says what is missing.
    page.write_text("# Exit codes\n\nOnly prose.\n", encoding="utf-8")
    assert gen.main(["--docs", str(docs_copy)]) == 2
    assert page.read_text(encoding="utf-8") == "# Exit codes\n\nOnly prose.\n"


def test_a_flag_added_to_the_agent_shows_up_and_fails_the_check(
        gen: ModuleType, docs_copy: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    assert gen.main(["--check", "--docs", str(docs_copy)]) == 0
    parser = _cli._parser

    def with_new_flag() -> argparse.ArgumentParser:
        built = parser()
        run = next(a for a in built._actions if isinstance(a, argparse._SubParsersAction)
                   ).choices["run"]
        run.add_argument("--brand-new", metavar="N",
                         help="a flag nobody documented (NUMPARITY_BRAND_NEW)")
        return built

    monkeypatch.setattr(_cli, "_parser", with_new_flag)
    page = gen.agent_cli_page()
    row = next(line for line in page.splitlines() if "--brand-new" in line)
    assert "`--brand-new N`" in row and "a flag nobody documented" in row
    assert "`NUMPARITY_BRAND_NEW`" in row
    assert gen.main(["--check", "--docs", str(docs_copy)]) == 1
    assert "reference/cli-agent.md differs from the code: run `make docs-ref`" in \
        capsys.readouterr().err
    # And `make docs-ref` (without --check) writes it: the check then passes.
    assert gen.main(["--docs", str(docs_copy)]) == 0
    assert "--brand-new" in (docs_copy / "reference" / "cli-agent.md").read_text()
    assert gen.main(["--check", "--docs", str(docs_copy)]) == 0


def test_a_server_setting_flag_and_exit_code_added_show_up(
        gen: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    class Extended(server_settings.Settings):
        brand_new_limit: int = Field(default=7, ge=1, description="A limit added today.")

    monkeypatch.setattr(server_settings, "Settings", Extended)
    settings_page = gen.settings_page()
    assert "### NUMPARITY_BRAND_NEW_LIMIT" in settings_page
    section = settings_page.split("### NUMPARITY_BRAND_NEW_LIMIT", 1)[1].split("###")[0]
    assert "`brand_new_limit` · type `int` · ≥ 1 · default `7`" in section
    assert "A limit added today." in section

    parser = server_cli._parser

    def with_new_flag() -> argparse.ArgumentParser:
        built = parser()
        commands = next(a for a in built._actions
                        if isinstance(a, argparse._SubParsersAction))
        commands.choices["serve"].add_argument("--brand-new", default=3, help="new today")
        return built

    monkeypatch.setattr(server_cli, "_parser", with_new_flag)
    monkeypatch.setitem(server_cli.EXIT_CODES, 9, "a code added today")
    serve = gen.server_cli_page().split("## `numparity-server serve`", 1)[1].split("## ")[0]
    assert "| `--brand-new BRAND_NEW` | new today | `3` |" in serve
    assert "| `9` | a code added today |" in gen.exit_codes_page()


def all_commands(gen: ModuleType) -> Iterator[tuple[str, argparse.Action]]:
    for command in gen.agent_commands() + gen.server_commands():
        for action in gen.documented(command.parser):
            yield command.prog, action


def test_every_flag_and_argument_says_what_it_does(gen: ModuleType) -> None:
    undocumented = [f"{prog} {gen.invocation(action)}" for prog, action in all_commands(gen)
                    if not gen.help_text(action, prog).strip()]
    assert not undocumented, f"add help= to: {undocumented}"
    summaries = [c.prog for c in gen.agent_commands() + gen.server_commands()
                 if not c.summary.strip()]
    assert not summaries, f"add help= to the subcommands {summaries}"


def test_every_option_argparse_prints_is_on_the_page(gen: ModuleType) -> None:
    """An independent reading: the options argparse's own usage line lists."""
    pages = {"numparity-agent": gen.agent_cli_page(), "numparity-server": gen.server_cli_page()}
    for command in gen.agent_commands() + gen.server_commands():
        page = pages[command.prog.split()[0]]
        section = page.split(f"## `{command.prog}`\n", 1)
        if len(section) == 1:  # a group (`token`): its commands have the sections
            continue
        body = section[1].split("\n## ")[0]
        printed = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", command.parser.format_usage()))
        printed -= {"--help"}
        on_page = set(re.findall(r"`(--[a-z][a-z0-9-]*)", body))
        assert printed <= on_page, (command.prog, sorted(printed - on_page))


def test_every_setting_has_a_description() -> None:
    missing = [name for name, field in server_settings.Settings.model_fields.items()
               if not (field.description or "").strip()]
    assert not missing, f"add Field(description=...) to the settings {missing}"


def test_every_variable_a_help_names_exists(gen: ModuleType) -> None:
    agent = {_config.env_name(key) for key in _config.KINDS} | {_config.CONFIG_ENV}
    prefix = server_settings.Settings.model_config.get("env_prefix", "")
    server = {prefix + name.upper() for name in server_settings.Settings.model_fields}
    for prog, action in all_commands(gen):
        known = agent if prog.startswith("numparity-agent") else server
        named = set(gen.variables(gen.help_text(action, prog)))
        assert named <= known, (prog, gen.invocation(action), sorted(named - known))


def test_every_agent_config_key_has_an_option_naming_its_variable(gen: ModuleType) -> None:
    commands = [(c.prog, action) for c in gen.agent_commands()
                for action in gen.documented(c.parser)]
    page = gen.settings_page()
    for key, kind in _config.KINDS.items():
        found = gen._key_options(commands, key)
        assert found, f"config key {key} has no option"
        helps = " ".join(action.help or "" for _prog, action in found)
        assert _config.env_name(key) in helps, (key, helps)
        assert _config.KIND_HELP.get(kind), f"kind {kind} of {key} is not described"
        # `run`'s own option where it has one (--upload-timeout), else every option that
        # sets the key (check's --fail-open / --fail-closed).
        assert f"| `{key}` | `{gen.invocation(found[0][1])}" in page, key
    run = next(c.parser for c in gen.agent_commands() if c.prog == "numparity-agent run")
    assert gen._key_options([("run", a) for a in run._actions], "server")


def test_every_agent_exit_code_is_explained(gen: ModuleType) -> None:
    defined = {value for name, value in vars(_cli).items()
               if name.startswith("EXIT_") and isinstance(value, int)}
    codes, notes = gen.agent_exit_codes()
    assert {code for code, _meaning in codes} == defined
    assert all(meaning.strip() for _code, meaning in codes)
    assert any("first of 2, 6, 4, 5, 8, 3" in note for note in notes)
    # One entry per code, its continuation lines joined: code 3's whole sentence.
    three = dict(codes)[3]
    assert three.startswith("spooled:") and three.endswith("the next run or flush sends it")
    assert set(server_cli.EXIT_CODES) == {server_cli.EXIT_OK, server_cli.EXIT_FAILED,
                                          server_cli.EXIT_USAGE}


def test_the_metrics_page_lists_every_family_with_its_labels(gen: ModuleType) -> None:
    rows = {cells[0]: cells[1:] for line in gen.metrics_page().splitlines()
            if line.startswith("| `numparity_")
            for cells in [[cell.strip() for cell in line.strip("|").split(" | ")]]}
    assert rows["`numparity_runs_ingested_total`"][:2] == ["counter", "`outcome`"]
    assert rows["`numparity_groups`"][:2] == ["gauge", "`suite`, `workload`, `variant`"]
    assert rows["`numparity_nodes`"][:2] == ["gauge", "`status`"]
    # A histogram's `le` is not a label of its own.
    assert rows["`numparity_fleet_last_run_age_seconds`"][:2] == ["histogram", ""]
    assert all(cells[2] for cells in rows.values()), "a metric without its help"

