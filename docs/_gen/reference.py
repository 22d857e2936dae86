"""The manual's reference pages that come from the code (`make docs-ref`).

- ``reference/cli-agent.md``, ``reference/cli-server.md``: every command and option of
  ``numparity-agent`` and ``numparity-server``, walked from their argparse parsers: the
  help text as ``--help`` prints it, the default, the ``NUMPARITY_*`` variables it names;
- ``reference/settings.md``: the server's settings (its pydantic ``Settings``: field,
  variable, type, default, constraints, description) and the agent's configuration keys
  (``_config.KINDS``, each with the option that sets it, `run`'s where it has one);
- ``reference/exit-codes.md``: both programs' exit codes, from their own definitions;
- ``reference/metrics.md``: every metric ``GET /metrics`` answers, from its collectors;
- ``reference/api-operations.md``: every operation of the served OpenAPI schema.

Each page's generated part lies between two HTML comments (BEGIN, END below); what is
written by hand above or below them is kept. ``python docs/_gen/reference.py`` writes
them (``make docs-ref``); ``--check`` writes nothing and exits 1 naming the pages that
differ from the code (what ``tests/docs`` checks). Nothing here
depends on the terminal, the clock or the Python version (argparse's own help layout
does, so the options are laid out here).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from types import UnionType
from typing import Any, get_args

DOCS = Path(__file__).resolve().parents[1]
# The generated part of a page lies between these lines; what is above or below them is
# written by hand and kept when the part is generated again.
BEGIN = "<!-- Generated from the code by docs/_gen/reference.py"
END = "<!-- End of the generated part. -->"
VARIABLE = re.compile(r"\bNUMPARITY_[A-Z0-9_]*[A-Z0-9]\b")
_SPECIAL = re.compile(r"([\\`*_\[\]|])")
MIB = 1024 * 1024


# ---- Markdown ---------------------------------------------------------------------------


def text(value: str) -> str:
    """``value`` as Markdown text on one line, shown as written (no emphasis, no HTML,
    no table cell break)."""
    value = " ".join(value.split())
    value = value.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _SPECIAL.sub(r"\\\1", value)


def code(value: object) -> str:
    """``value`` as inline code (a backtick inside it is not expected of an option)."""
    shown = str(value)
    return f"`` {shown} ``" if "`" in shown else f"`{shown}`"


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(cell or " " for cell in row) + " |" for row in rows]
    return lines


def lines_text(body: list[str]) -> str:
    return "\n".join(body).rstrip("\n") + "\n"


# ---- command lines ----------------------------------------------------------------------


@dataclass(frozen=True)
class Command:
    """One command of a program: ``numparity-server token create`` and its parser."""

    prog: str
    summary: str
    parser: argparse.ArgumentParser


def commands(parser: argparse.ArgumentParser, prog: str, summary: str = "",
             delegated: dict[str, argparse.ArgumentParser] | None = None) -> list[Command]:
    """``parser``'s command and every subcommand below it, depth first, in the order
    ``--help`` lists them. ``delegated``: commands that hand their arguments to a parser
    of their own (``numparity-server demo``), by prog."""
    delegated = delegated or {}
    parser = delegated.get(prog, parser)
    found = [Command(prog, summary or parser.description or "", parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            summaries = {sub.dest: sub.help or "" for sub in action._get_subactions()}
            for name, sub in action.choices.items():
                found += commands(sub, f"{prog} {name}", summaries.get(name, ""), delegated)
    return found


def documented(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The options and arguments a user gives (not --help, not the subcommand)."""
    return [action for action in parser._actions
            if not isinstance(action, (argparse._HelpAction, argparse._SubParsersAction))]


def invocation(action: argparse.Action) -> str:
    """``--label K=V``, ``--variants V [V ...]``, ``--role {agent,reader,admin}``."""
    if action.choices is not None:
        metavar = "{" + ",".join(str(choice) for choice in action.choices) + "}"
    elif action.metavar is not None:
        metavar = str(action.metavar)
    else:
        metavar = action.dest.upper() if action.option_strings else action.dest
    nargs = action.nargs
    if nargs == 0:
        value = ""
    elif nargs is None or nargs == argparse.OPTIONAL and not action.option_strings:
        value = metavar
    elif nargs == argparse.OPTIONAL:
        value = f"[{metavar}]"
    elif nargs == argparse.ONE_OR_MORE:
        value = f"{metavar} [{metavar} ...]"
    elif nargs == argparse.ZERO_OR_MORE:
        value = f"[{metavar} ...]"
    else:
        value = " ".join([metavar] * int(nargs))
    names = ", ".join(action.option_strings)
    return " ".join(part for part in (names, value) if part)


def help_text(action: argparse.Action, prog: str) -> str:
    """The help as ``--help`` prints it (``%(default)s`` expanded as argparse does)."""
    if not action.help or action.help is argparse.SUPPRESS:
        return ""
    params = {key: value for key, value in vars(action).items()
              if value is not argparse.SUPPRESS}
    params["prog"] = prog
    if params.get("choices") is not None:
        params["choices"] = ", ".join(str(choice) for choice in params["choices"])
    return action.help % params


def default_text(action: argparse.Action) -> str:
    default = action.default
    if default is None or default is argparse.SUPPRESS or action.nargs == 0 \
            or default == [] or default == "":
        return ""
    return code(default)


def variables(help_: str) -> list[str]:
    """The ``NUMPARITY_*`` variables a help text names, in order, once each."""
    return list(dict.fromkeys(VARIABLE.findall(help_)))


def synopsis(command: Command) -> str:
    parts = [command.prog]
    actions = documented(command.parser)
    for action in actions:
        if action.option_strings and action.required:
            parts.append(invocation(action).split(", ")[-1])
    if any(a.option_strings and not a.required for a in actions):
        parts.append("[options]")
    parts += [invocation(a) for a in actions if not a.option_strings]
    if any(isinstance(a, argparse._SubParsersAction) for a in command.parser._actions):
        parts.append("COMMAND")
    return " ".join(parts)


def anchor(prog: str) -> str:
    """The heading's anchor (mkdocs.yml's slugify: GitHub's)."""
    return re.sub(r"[^\w\- ]", "", prog.lower()).replace(" ", "-")


def cli_page(command_list: list[Command], intro: str) -> str:
    """``intro``: Markdown, as written."""
    top, *subcommands = command_list
    body = [intro, ""]
    leaves = [c for c in subcommands if not _has_subcommands(c.parser)]
    body += [f"- [`{c.prog}`](#{anchor(c.prog)}): {text(c.summary)}" for c in leaves]
    body += ["", "Every command also takes `-h`, `--help`: what this page says, in the "
             "terminal.", ""]
    for command in command_list:
        actions = documented(command.parser)
        if command is not top and not actions and _has_subcommands(command.parser):
            continue  # a group (`token`): its commands have sections of their own
        body += [f"## `{command.prog}`", ""]
        if command.summary:
            body += [text(command.summary), ""]
        body += ["```text", synopsis(command), "```", ""]
        if actions:
            rows = []
            for action in actions:
                described = help_text(action, command.prog)
                required = "required. " if action.required and action.option_strings else ""
                rows.append((code(invocation(action)), required + text(described),
                             default_text(action),
                             ", ".join(code(v) for v in variables(described))))
            body += table(("option", "what it does", "default", "variables"), rows)
            body.append("")
    return lines_text(body)


def _has_subcommands(parser: argparse.ArgumentParser) -> bool:
    return any(isinstance(a, argparse._SubParsersAction) for a in parser._actions)


def agent_commands() -> list[Command]:
    from numparity_agent import _cli

    return commands(_cli._parser(), "numparity-agent")


def server_commands() -> list[Command]:
    from numparity_server import cli, demo

    return commands(cli._parser(), "numparity-server",
                    delegated={"numparity-server demo": demo.parser()})


def agent_cli_page() -> str:
    return cli_page(
        agent_commands(),
        "The agent's commands, on every node. Its settings come from the command line, "
        "then the `NUMPARITY_*` variables, then the config file: "
        "[settings and variables](settings.md#the-agents-configuration-keys).")


def server_cli_page() -> str:
    return cli_page(
        server_commands(),
        "The server's commands: the database, the HTTP server, tokens, retention and the "
        "demo. Every command takes `--database-url`, else "
        "[`NUMPARITY_DATABASE_URL`](settings.md#numparity_database_url); the server's "
        "other settings are [variables](settings.md#the-servers-settings).")


# ---- settings ---------------------------------------------------------------------------


def type_text(annotation: Any) -> str:
    if isinstance(annotation, UnionType) or get_args(annotation):
        return " | ".join(type_text(arg) for arg in get_args(annotation))
    if annotation is type(None):
        return "None"
    return getattr(annotation, "__name__", str(annotation))


def value_text(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return code(str(value).lower())
    shown = code(value)
    if isinstance(value, int) and value >= MIB and value % MIB == 0:
        shown += f" ({value // MIB} MiB)"
    return shown


def constraints_text(metadata: Iterable[Any]) -> str:
    """``> 0``, ``≥ 0``: the bounds pydantic checks (annotated_types' Gt, Ge, Lt, Le)."""
    signs = {"gt": ">", "ge": "≥", "lt": "<", "le": "≤"}
    found = []
    for item in metadata:
        for name, sign in signs.items():
            bound = getattr(item, name, None)
            if bound is not None:
                found.append(f"{sign} {bound}")
    return ", ".join(found)


def settings_page() -> str:
    from numparity_agent import _config
    from numparity_server.kit.settings import Settings

    prefix = Settings.model_config.get("env_prefix", "")
    body = [
        "## The server's settings", "",
        f"Each is an environment variable of the server's processes (`{prefix}*`, the "
        "names below, case-insensitive); `numparity-server serve --workers N` hands them to "
        "its workers. A value that is not of the setting's type, or out of its bounds, "
        "stops every `numparity-server` command with exit 2 and a message naming the "
        "variable.", "",
    ]
    fields = Settings.model_fields
    body += table(("variable", "default"), [
        (f"[`{prefix}{name.upper()}`](#{(prefix + name).lower()})",
         value_text(field.get_default())) for name, field in fields.items()])
    body.append("")
    for name, field in fields.items():
        variable = prefix + name.upper()
        facts = [f"`{name}`", f"type {code(type_text(field.annotation))}"]
        bounds = constraints_text(field.metadata)
        if bounds:
            facts.append(text(bounds))
        facts.append(f"default {value_text(field.get_default())}")
        body += [f"### {variable}", "", " · ".join(facts), "", text(field.description or ""),
                 ""]
    commands = [(c.prog, action) for c in agent_commands() for action in documented(c.parser)]
    body += [
        "## The agent's configuration keys", "",
        "The agent takes each setting from its command line, else the variable, else the "
        f"key in its TOML config file: `--config FILE`, else `{_config.CONFIG_ENV}`, else "
        f"`{_config.DEFAULT_CONFIG}` when it exists. An unknown key or a value of the "
        "wrong kind stops the agent with exit 2 naming it "
        "([`numparity-agent`](cli-agent.md#numparity-agent-run)).", "",
    ]
    rows = []
    for key, kind in _config.KINDS.items():
        found = _key_options(commands, key)
        rows.append((code(key), " / ".join(code(invocation(a)) for _, a in found),
                     code(_config.env_name(key)), text(_config.KIND_HELP[kind]),
                     text(" ".join(help_text(a, prog) for prog, a in found))))
    body += table(("key", "option", "variable", "value", "what it sets"), rows)
    body.append("")
    return lines_text(body)


def _key_options(commands: list[tuple[str, argparse.Action]],
                 key: str) -> list[tuple[str, argparse.Action]]:
    """The options that set a config key: its own (``--upload-timeout``, `run`'s first),
    else every option storing into it (``--fail-open`` / ``--fail-closed``)."""
    from numparity_agent import _config

    option = _config.option_name(key)
    own = [(prog, a) for prog, a in commands if option in a.option_strings]
    if own:
        return own[:1]
    found: list[tuple[str, argparse.Action]] = []
    for prog, action in commands:
        if action.dest == key and all(a is not action for _, a in found):
            found.append((prog, action))
    if not found:
        raise SystemExit(f"docs-ref: the agent's config key {key!r} has no option")
    return found


def _run_parser() -> argparse.ArgumentParser:
    return next(c.parser for c in agent_commands() if c.prog == "numparity-agent run")


# ---- exit codes -------------------------------------------------------------------------


def agent_exit_codes(help_text: str | None = None) -> tuple[list[tuple[int, str]], list[str]]:
    """(code, meaning) of each line of the agent's ``EXIT_CODES_HELP`` (what ``--help``
    prints; or of ``help_text``, `check`'s), and the notes after them."""
    from numparity_agent import _cli

    codes: list[tuple[int, str]] = []
    notes: list[str] = []
    for line in (help_text or _cli.EXIT_CODES_HELP).splitlines()[1:]:
        entry = re.match(r"^ {2}(\d+) +(.*)$", line)
        if entry:
            codes.append((int(entry.group(1)), entry.group(2)))
        elif line.startswith("     ") and codes:
            code_, meaning = codes[-1]
            codes[-1] = (code_, f"{meaning} {line.strip()}")
        elif line.strip():
            notes.append(line.strip())
    return codes, notes


def exit_codes_page() -> str:
    from numparity_server import cli

    codes, notes = agent_exit_codes()
    body = ["## numparity-agent", ""]
    body += table(("code", "meaning"), [(code(c), text(m)) for c, m in codes])
    body += [""] + [text(note[:1].upper() + note[1:]) + "." for note in notes]
    from numparity_agent._check_verdicts import CHECK_EXIT_CODES_HELP

    codes, notes = agent_exit_codes(CHECK_EXIT_CODES_HELP)
    body += ["", "## numparity-agent check", "",
             "`check` (the preflight) has codes of its own, one per cause:", ""]
    body += table(("code", "meaning"), [(code(c), text(m)) for c, m in codes])
    body += [""] + [text(note[:1].upper() + note[1:]) + "." for note in notes]
    body += ["", "## numparity-server", ""]
    body += table(("code", "meaning"),
                  [(code(c), text(m)) for c, m in sorted(cli.EXIT_CODES.items())])
    body.append("")
    return lines_text(body)


# ---- metrics ----------------------------------------------------------------------------


def metric_families() -> list[Any]:
    """Every family ``/metrics`` answers: the server process's, then the fleet's, read
    from a snapshot with one value of each kind so that every family shows its labels."""
    from numparity_server.audit.schemas import NodeStatusCounts
    from numparity_server.kit.ingest_meter import REGISTRY
    from numparity_server.metrics.service import (
        AGE_BUCKETS,
        FleetSnapshot,
        KeyGroups,
        fleet_metrics,
    )

    summary = NodeStatusCounts(**dict.fromkeys(NodeStatusCounts.model_fields, 0))
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    # One key listed and one not: the series of both show.
    groups = KeyGroups(listed={("suite", "workload", "variant"): 1}, keys=2, others_most=1)
    snapshot = FleetSnapshot(summary=summary, groups=groups,
                             last_runs=[("node", now)], taken_at=now,
                             age_counts=[0] * (len(AGE_BUCKETS) + 1))
    return [*REGISTRY.collect(), *fleet_metrics(snapshot, now=now)]


def exposed_name(family: Any) -> str:
    return f"{family.name}_total" if family.type == "counter" else family.name


def metric_labels(family: Any) -> list[str]:
    names: dict[str, None] = {}
    for sample in family.samples:
        names.update(dict.fromkeys(label for label in sample.labels
                                   if label not in ("le", "quantile")))
    return list(names)


def metrics_page() -> str:
    rows = [(code(exposed_name(f)), f.type, ", ".join(code(label) for label in
                                                       metric_labels(f)), text(f.documentation))
            for f in metric_families()]
    body = ["`GET /metrics` answers these in Prometheus's text format (with a reader "
            "token, or none where reads are open). A histogram's series are its `_bucket`, "
            "`_count` and `_sum`; a counter's also its `_created` time. Scraping them: "
            "[Prometheus and Grafana](../how-to/prometheus-grafana.md).", ""]
    body += table(("metric", "type", "labels", "what it counts"), rows)
    body.append("")
    return lines_text(body)


# ---- the API ----------------------------------------------------------------------------


def api_operations() -> list[tuple[str, str, str]]:
    """(method, path, summary) of every operation of the OpenAPI schema the server serves,
    in its order; the summary as ``GET /api/v1`` words it."""
    from numparity_server.app import create_app
    from numparity_server.catalog.api import _summary
    from numparity_server.kit.settings import Settings

    # No database is opened: the schema is built from the routes.
    schema = create_app(Settings(database_url="sqlite://")).openapi()
    return [(method.upper(), path, _summary(operation))
            for path, operations in schema["paths"].items()
            for method, operation in operations.items()]


def api_operations_page() -> str:
    body = ["Every operation of the server's HTTP API, as its OpenAPI schema describes "
            "it ([calling it](api.md)). The server serves the whole schema, each "
            "operation's parameters, answers and error codes included:", "",
            "- [`/docs`](/docs): Swagger UI, where a reader token tries each operation;",
            "- [`/redoc`](/redoc): the same as one long page;",
            "- [`/openapi.json`](/openapi.json): the schema itself.", "",
            "These links open on the server this manual is read from (`/manual/`).", ""]
    body += table(("method", "path", "what it answers"),
                  [(code(method), code(path), text(summary))
                   for method, path, summary in api_operations()])
    body.append("")
    return lines_text(body)


# ---- the pages --------------------------------------------------------------------------


@dataclass(frozen=True)
class Page:
    title: str  # of a page the generator creates; the page's own title wins after that
    source: str  # what to change for the page to change, said in its marker
    render: Callable[[], str]  # the generated part


PAGES: dict[str, Page] = {
    "reference/cli-agent.md": Page("numparity-agent", "agent/_cli.py", agent_cli_page),
    "reference/cli-server.md": Page("numparity-server", "server/cli.py or server/demo.py",
                                    server_cli_page),
    "reference/settings.md": Page("Settings and variables",
                                  "server/kit/settings.py or agent/_config.py", settings_page),
    "reference/exit-codes.md": Page("Exit codes", "agent/_cli.py or server/cli.py",
                                    exit_codes_page),
    "reference/metrics.md": Page(
        "Metrics", "server/kit/ingest_meter.py or server/metrics/service.py", metrics_page),
    "reference/api-operations.md": Page("API operations", "a route (server/*/api.py)",
                                        api_operations_page),
}


class GeneratedPartMissing(Exception):
    """A page that exists but has lost its markers: nothing would say where to write."""


def merged(existing: str | None, page: Page, generated: str) -> str:
    """The page's text with ``generated`` as its generated part; the rest as it is."""
    region = (f"{BEGIN} (after changing {page.source}, run `make docs-ref`): edit above or "
              f"below, not between. -->\n\n{generated}\n{END}")
    if existing is None:
        return f"# {page.title}\n\n{region}\n"
    start = existing.find(BEGIN)
    end = existing.find(END, start)
    if start < 0 or end < 0:
        raise GeneratedPartMissing(f"it has no generated part: put the lines {BEGIN} ... -->"
                                   f" and {END} back where it goes")
    return existing[:start] + region + existing[end + len(END):]


def expected_pages(docs: Path = DOCS) -> dict[str, str]:
    """Each generated page's whole text as it should be now."""
    found = {}
    for path, page in PAGES.items():
        target = docs / path
        existing = target.read_text(encoding="utf-8") if target.is_file() else None
        try:
            found[path] = merged(existing, page, page.render())
        except GeneratedPartMissing as exc:
            raise GeneratedPartMissing(f"{target}: {exc}") from None
    return found


def stale_pages(docs: Path = DOCS) -> list[str]:
    """The generated pages whose committed text differs from what the code gives now."""
    return [path for path, text in expected_pages(docs).items()
            if not (docs / path).is_file()
            or (docs / path).read_text(encoding="utf-8") != text]


def write_all(docs: Path = DOCS) -> list[str]:
    """Write every page whose text changed; the paths written."""
    written = []
    for path, text in expected_pages(docs).items():
        target = docs / path
        if not target.is_file() or target.read_text(encoding="utf-8") != text:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
            written.append(path)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write the manual's generated reference.")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 naming the pages that differ")
    parser.add_argument("--docs", type=Path, default=DOCS, metavar="DIR",
                        help="the manual's sources (default: this checkout's docs/)")
    args = parser.parse_args(argv)
    try:
        if args.check:
            stale = stale_pages(args.docs)
            for path in stale:
                print(f"{args.docs / path} differs from the code: run `make docs-ref`",
                      file=sys.stderr)
            return 1 if stale else 0
        written = write_all(args.docs)
    except GeneratedPartMissing as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"docs-ref: {len(written)} of {len(PAGES)} reference pages rewritten"
          + (f" ({', '.join(written)})" if written else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
