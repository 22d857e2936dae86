"""A new user follows the README's quick start literally.

The command comes out of README.md's first fenced block (so the README cannot drift from
the product): ``make demo``, run as a new user's shell runs it (no ``NUMPARITY_*``
variables), in this checkout, with this test's own ``.venv``. Then, as the README and
the demo's own output say: read the report, open the printed dashboard address, sign in
through the token form with the printed reader token, open every page the fleet page
links to, run the printed ``numparity-agent run …`` line in another shell and see the
node appear. At the end the demo is stopped with SIGTERM (as a process manager stops it)
and must leave nothing behind.

What the report must say is read from the fleet page the user sees (the machine's real
differences), never assumed: which cells differ depends on the CPU (design §5).
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urldefrag, urljoin, urlsplit

import httpx
import pytest
from bs4 import BeautifulSoup
from helpers.processes import Output, children, wait_group_gone

from numparity_server.demo import FLEET
from numparity_server.demo import WORKLOADS as EXPLAINED

pytestmark = pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two cores")

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DRILL_NODE = next(node.name for node in FLEET if "--fault-drill" in node.args)
MKL_NODE = next(node.name for node in FLEET if "MKL_CBWR" in node.env)
THREAD_NODE = next(node.name for node in FLEET if "OMP_NUM_THREADS" in node.env)
# How long the demo may take to build its fleet before the test gives up (a guard, not a
# measurement: ~40-80 s on the 2-core CI machine).
READY_WITHIN_S = 600


def quick_start_commands() -> list[str]:
    """The commands of the README's first ```sh block, comments dropped."""
    block = re.search(r"```sh\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    assert block, "README.md has no ```sh block"
    commands = [line.split("#", 1)[0].strip() for line in block.group(1).splitlines()]
    return [command for command in commands if command]


def new_user_env() -> dict[str, str]:
    """A shell that never heard of numparity (none of the tests' NUMPARITY_* settings),
    and not inside `make test` (whose MAKEFLAGS and MAKELEVEL a sub-make would read)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("NUMPARITY_")
            and k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")}


@dataclass
class Heatmap:
    columns: list[str]  # "workload/variant"
    cells: dict[str, dict[str, str]]  # node -> column -> verdict
    counts: dict[str, int]  # the legend's count per verdict
    links: list[str]  # every link on the page, absolute, without fragment


def read_fleet_page(html: str, base_url: str) -> Heatmap:
    soup = BeautifulSoup(html, "html.parser")
    table = soup.find("table", id="heatmap")
    assert table is not None, html[:2000]
    columns = [str(th["data-key"]) for th in table.select("th[data-key]")]
    cells = {}
    for row in table.select("tbody tr[data-node]"):
        verdicts = [str(td["data-verdict"]) for td in row.select("td.cell")]
        assert len(verdicts) == len(columns), row
        cells[str(row["data-node"])] = dict(zip(columns, verdicts, strict=True))
    counts = {}
    for item in soup.select("ul.legend li"):
        swatch, count = item.select_one(".swatch"), item.select_one(".count")
        if swatch is not None and count is not None:
            counts[str(swatch["data-verdict"])] = int(count.get_text())
    links = [urldefrag(urljoin(base_url + "/", str(a["href"])))[0]
             for a in soup.select("a[href]")]
    return Heatmap(columns, cells, counts, list(dict.fromkeys(links)))


@dataclass
class QuickStart:
    process: subprocess.Popen[str]
    output: Output
    workdir: Path  # the demo's temporary folder
    base_url: str
    reader_token: str
    agent_line: str  # the printed "NUMPARITY_TOKEN=… numparity-agent run …"
    your_node: str
    client: httpx.Client  # signed in through the token form
    fleet_page: Heatmap  # as first shown after signing in
    report: list[str] = field(default_factory=list)  # the report's lines


def sign_in(client: httpx.Client, base_url: str, token: str) -> httpx.Response:
    """What a browser does: open the address, get the token form, submit it."""
    page = client.get(base_url + "/")
    assert urlsplit(str(page.url)).path == "/login", (page.url, page.text[:500])
    form = BeautifulSoup(page.text, "html.parser").find("form", id="token-form")
    assert form is not None, page.text[:2000]
    fields = {str(i["name"]): str(i.get("value", "")) for i in form.select("input[name]")}
    fields["token"] = token
    return client.post(urljoin(str(page.url), str(form["action"])), data=fields,
                       headers={"Origin": base_url, "Referer": str(page.url)})


def demo_process(make_pid: int) -> int:
    """The ``numparity-server demo`` that make started (directly, or through a shell)."""
    pending, found = [make_pid], []
    while pending:
        for child in children(pending.pop()):
            pending.append(child)
            with contextlib.suppress(OSError):
                words = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
                if any(w.endswith(b"numparity-server") for w in words) and b"demo" in words:
                    found.append(child)
    assert len(found) == 1, found
    return found[0]


@pytest.fixture(scope="module")
def quick_start() -> Iterator[QuickStart]:
    (demo,) = [c for c in quick_start_commands() if "demo" in c]
    # This test's own environment is the .venv the README's command makes; the venv step
    # is not repeated (-o: its stamp counts as up to date).
    venv = Path(sys.prefix)
    assert sys.prefix != sys.base_prefix, "run the tests from the project's .venv"
    command = [*shlex.split(demo), f"VENV={venv}", "-o", f"{venv}/.numparity-installed"]
    process = subprocess.Popen(command, cwd=ROOT, env=new_user_env(), text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               start_new_session=True)
    output = Output(process.stdout)
    stopped = False
    try:
        database = output.wait_for(r"database sqlite:///(\S+)/numparity\.db", 120)
        output.wait_for(r"^Dashboard: ", READY_WITHIN_S)  # the report is complete
        ready = output.wait_for(r"^Dashboard: (http://\S+)/ — sign in with the reader "
                                r"token (\S+)$", 1)
        agent_line = output.wait_for(r"^  (NUMPARITY_TOKEN=\S+ \S*numparity-agent run .*)$",
                                     10).group(1)
        your_node = output.wait_for(r"^It appears on the fleet page as (\S+) ", 10).group(1)
        base_url, reader = ready.group(1), ready.group(2)
        with httpx.Client(timeout=120, follow_redirects=True) as client:
            landed = sign_in(client, base_url, reader)
            assert landed.status_code == 200 and urlsplit(str(landed.url)).path == "/", (
                landed.url, landed.text[:1000])
            started = QuickStart(
                process=process, output=output, workdir=Path(database.group(1)),
                base_url=base_url, reader_token=reader, agent_line=agent_line,
                your_node=your_node, client=client,
                fleet_page=read_fleet_page(landed.text, base_url),
                report=output.text().split("\nDashboard: ")[0].splitlines())
            yield started
            # The end of the story: `kill` (SIGTERM) stops the demo, which leaves nothing
            # behind; make, its parent, then ends with the demo's exit code.
            os.kill(demo_process(process.pid), signal.SIGTERM)
            process.wait(timeout=120)
            wait_group_gone(process.pid)
            stopped = True
            output.close()
            assert process.returncode == 0, output.text()[-3000:]
            assert not started.workdir.exists(), f"{started.workdir} was left behind"
            assert f"stopped; removed {started.workdir}" in output.text()
    finally:
        if not stopped:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            wait_group_gone(process.pid)


# ---- the report says what the fleet page shows ------------------------------------------


def _findings(report: list[str]) -> list[tuple[str, str, str, set[str]]]:
    """(column, verdict, the cause above it, its nodes) of each finding line."""
    found = []
    cause = ""
    line_re = re.compile(r"^    (\S+/\S+)\s+(\S+)\s+(.+?)(?: against \S+.*| \(.*\))?$")
    for line in report:
        if line.startswith("  ") and not line.startswith("   ") and ": " in line:
            cause = line.strip()
        elif match := line_re.match(line):
            found.append((match.group(1), match.group(2), cause,
                          {name.strip() for name in match.group(3).split(",")}))
    return found


def finding_lines(report: list[str]) -> dict[tuple[str, str], tuple[str, set[str]]]:
    """The report's finding lines: (column, verdict) → (the causes above them, their
    nodes); two causes can give one column the same verdict."""
    found: dict[tuple[str, str], tuple[str, set[str]]] = {}
    for column, verdict, cause, nodes in _findings(report):
        previous = found.get((column, verdict))
        found[(column, verdict)] = (
            cause if previous is None else previous[0] + "\n" + cause,
            nodes | (previous[1] if previous else set()))
    return found


def cause_of(report: list[str], column: str, node: str) -> str:
    """The cause of the finding line of ``column`` that names ``node``."""
    (cause,) = [cause for found, _verdict, cause, nodes in _findings(report)
                if found == column and node in nodes]
    return cause


def test_report_names_every_cell_the_fleet_page_colours(quick_start: QuickStart) -> None:
    page = quick_start.fleet_page
    report = quick_start.report
    findings = finding_lines(report)
    differing = {(node, column, verdict) for node, row in page.cells.items()
                 for column, verdict in row.items() if verdict != "identical"}
    assert differing, "the demo fleet has real differences on any x86-64 CPU"
    for node, column, verdict in differing:
        assert node in findings.get((column, verdict), ("", set()))[1], (
            f"the fleet page shows {node} {column} {verdict}; the report does not say so:\n"
            + "\n".join(report))
    # …and names nothing the page does not show.
    for (column, verdict), (_cause, nodes) in findings.items():
        for node in nodes:
            assert page.cells[node][column] == verdict, (node, column, verdict)
    # The same counts as the page's legend.
    header = next(line for line in report if line.startswith("== fleet page"))
    for verdict, count in page.counts.items():
        if count:
            assert f"{count} {verdict}" in header, (verdict, count, header)


def test_report_says_why(quick_start: QuickStart) -> None:
    """Causes that hold on any x86-64 machine with two cores (design §5), each checked
    only where the page shows the cell differing."""
    findings = finding_lines(quick_start.report)
    cells = quick_start.fleet_page.cells
    for column in ("cnn/default", "cnn/strict"):
        verdict = cells[MKL_NODE][column]
        assert verdict != "identical", (MKL_NODE, column)
        cause, nodes = findings[(column, verdict)]
        assert MKL_NODE in nodes and "env_vars.MKL_CBWR (unset vs COMPATIBLE)" in cause, cause
    assert cells[THREAD_NODE]["probes/default"] != "identical"
    cause = cause_of(quick_start.report, "probes/default", THREAD_NODE)
    assert re.search(r"threads\.num_threads \(\d+ vs 1\)", cause), cause
    assert "OMP_NUM_THREADS (unset vs 1)" in cause and "MKL_CBWR" not in cause, cause
    # The fp64 judge has something to say (one node runs the float64 reference).
    assert any(re.search(r"fp64 judge on \S+: (not )?acceptable \(rmse", line)
               for line in quick_start.report), quick_start.report


def finding_blocks(report: list[str]) -> list[tuple[str, str, list[str]]]:
    """(cause, finding line, the lines indented below it) of every compared finding."""
    blocks: list[tuple[str, str, list[str]]] = []
    cause = ""
    for line in report:
        if line.startswith("  ") and not line.startswith("   ") and ": " in line:
            cause = line.strip()
        elif line.startswith("    ") and not line.startswith("     ") and " against " in line:
            blocks.append((cause, line.strip(), []))
        elif line.startswith("      ") and blocks:
            blocks[-1][2].append(line.strip())
    return blocks


def test_every_split_names_its_origin_op_and_the_setting_that_explains_it(
        quick_start: QuickStart) -> None:
    """Every agent traces its ops, and a stock node runs explain against each node whose
    settings differ (design §2.10, §2.11): each split caused by a setting shows where it
    starts and the setting, as explain found it on the stock node."""
    settings = {node.name: node.env for node in FLEET if node.env}
    blocks = [b for b in finding_blocks(quick_start.report) if b[0].startswith("explained by")]
    assert blocks, quick_start.report
    for _cause, line, below in blocks:
        assert any(text.startswith(("origin op ", "no origin op; ")) for text in below), (
            line, below)
        match = re.match(r"^\S+/\S+\s+\S+\s+(.+?) against ", line)
        assert match, line
        nodes = {name.strip() for name in match.group(1).split(",")}
        for node, env in settings.items():
            # explain reruns the fleet page's workloads, not the LLM-era checks.
            if node not in nodes or line.split("/")[0] not in EXPLAINED:
                continue
            wanted = ", ".join(f"{k}={v}" for k, v in sorted(env.items()))
            assert any(text.startswith("explain: ") and f"{node}'s bits with {wanted}" in text
                       for text in below), (node, line, below)


def test_report_marks_the_drill_with_its_flipped_bit(quick_start: QuickStart) -> None:
    """The flipped bit as the agent recorded it in its own document (the drill's newest
    run, in the demo's folder), against what the report prints."""
    runs = sorted((quick_start.workdir / "runs").glob(f"{DRILL_NODE}-*.json"))
    document = json.loads(runs[-1].read_text())
    assert document["drill"] is True
    flips = [r for r in document["results"] if "drill" in r]
    assert flips and all(r["variant"] == "strict" for r in flips), flips
    findings = finding_lines(quick_start.report)
    for result in flips:
        flip, column = result["drill"], f"{result['workload']}/strict"
        verdict = quick_start.fleet_page.cells[DRILL_NODE][column]
        if verdict == "identical":  # a workload without layers is not corrupted
            continue
        cause, nodes = findings[(column, verdict)]
        assert DRILL_NODE in nodes
        assert cause.startswith("a fault drill"), cause
        assert (f"bit {flip['bit']} of {flip['layer']}[{flip['index']}] flipped, "
                f"{flip['before']:.9g} → {flip['after']:.9g}") in cause, (flip, cause)
    audit = [line for line in quick_start.report if line.startswith("  suspect:")]
    assert any(DRILL_NODE in line and "drills" in line for line in audit), audit
    assert not any(line.startswith(("  suspect: lab-0", "  watch:")) for line in audit)


def test_cost_of_determinism_is_never_one_run_shown_as_fact(quick_start: QuickStart) -> None:
    report = quick_start.report
    assert not any(re.search(r"strict costs [\d.]+x default", line) for line in report)
    start = next(i for i, line in enumerate(report) if "cost of determinism" in line)
    for line in report[start + 1:]:
        if not line.startswith("    "):
            break
        # A figure with its uncertainty and the nodes' own ratios, or why it is not shown.
        assert ("±" in line and "node to node" in line) or "not shown" in line, line


def test_the_report_says_what_the_numerics_checks_say(quick_start: QuickStart) -> None:
    """The numerics lines against the audit the dashboard shows (its CSV)."""
    report = quick_start.report
    start = report.index("  numerics under default (the decoder and invariance workloads' "
                         "checks):")
    lines = []
    for line in report[start + 1:]:
        if not line.startswith("    "):
            break
        lines.append(line.strip())
    csv_text = quick_start.client.get(quick_start.base_url + "/audit.csv?table=numerics").text
    rows = [row for row in csv.DictReader(io.StringIO(csv_text, newline=""))
            if row["variant"] == "default"]
    assert rows and sum(int(line.rsplit("on ", 1)[1].split()[0]) for line in lines) \
        == len(rows)
    for row in rows:
        holds = row["batch_invariant"] == "True"
        expected = "batch-invariant yes" if holds else (
            f"batch-invariant no (at {row['batch_invariant_op']})")
        assert any(line.startswith(expected) for line in lines), (expected, lines)


def test_the_report_says_what_the_data_pipeline_measured(quick_start: QuickStart) -> None:
    """The data pipeline lines against the audit the dashboard shows (its CSV): every
    node runs `data` with real DataLoader workers, and the recipe holds on this CPU."""
    report = quick_start.report
    start = report.index("  data pipeline (real DataLoader workers, with and without the "
                         "seeds' recipe):")
    lines = []
    for line in report[start + 1:]:
        if not line.startswith("    "):
            break
        lines.append(line.strip())
    csv_text = quick_start.client.get(
        quick_start.base_url + "/audit.csv?table=data_pipeline").text
    rows = list(csv.DictReader(io.StringIO(csv_text, newline="")))
    assert rows and sum(int(line.rsplit("on ", 1)[1].split()[0]) for line in lines) \
        == len(rows)
    for row in rows:
        assert row["recipe_holds"] == "True" and row["needs_recipe"] == "True", row
        assert any(line.startswith("data: recipe holds; without it: ")
                   and row["without_broken"] in line for line in lines), (row, lines)


# ---- the dashboard, and a node of your own -------------------------------------------


def option_values(words: list[str], option: str) -> list[str]:
    """The values after ``option`` on a command line, up to the next option."""
    values = []
    for word in words[words.index(option) + 1:]:
        if word.startswith("-"):
            break
        values.append(word)
    return values


def test_every_page_linked_from_the_fleet_page_opens(quick_start: QuickStart) -> None:
    links = [url for url in quick_start.fleet_page.links
             if url.startswith(quick_start.base_url + "/")]
    kinds = {urlsplit(url).path.split("/")[1] for url in links}
    assert {"", "audit", "workloads", "nodes", "compare"} <= kinds, links
    judged = set()
    for url in links:
        response = quick_start.client.get(url)
        assert response.status_code < 400, (url, response.status_code, response.text[:1000])
        assert urlsplit(str(response.url)).path != "/login", f"{url} asked to sign in again"
        assert "Traceback" not in response.text, url
        if urlsplit(url).path.startswith("/workloads/"):
            soup = BeautifulSoup(response.text, "html.parser")
            judged |= {str(td["data-verdict"]) for td in soup.select("td.judge")}
    # One node runs fp64-reference, so the fp64 judge gives verdicts on the workload pages.
    assert judged & {"acceptable", "unacceptable"}, judged


def test_the_printed_command_adds_your_node(quick_start: QuickStart) -> None:
    # In another shell, in the folder `make demo` ran in, as the demo says.
    done = subprocess.run(quick_start.agent_line, shell=True, cwd=ROOT, env=new_user_env(),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    page = quick_start.client.get(quick_start.base_url + "/")
    assert page.status_code == 200
    fleet = read_fleet_page(page.text, quick_start.base_url)
    assert quick_start.your_node in fleet.cells, sorted(fleet.cells)
    words = shlex.split(quick_start.agent_line)
    for workload in option_values(words, "--workloads"):
        for variant in option_values(words, "--variants"):
            verdict = fleet.cells[quick_start.your_node][f"{workload}/{variant}"]
            assert verdict not in ("missing", "failed"), (workload, variant, verdict)


# ---- the README and the manual show what the demo prints -------------------------------------

# The lines of the examples that hold on any machine once the numbers, addresses,
# tokens, paths and the host name are masked (which cells differ depends on the CPU).
FRAME = ("numparity demo: server on", "== fleet page", "  each cell against",
         "== audit:", "  cost of determinism", "Dashboard:", "API:",
         "Add a node of your own", "  NUMPARITY_TOKEN=", "It appears on the fleet page",
         "Ctrl-C stops the demo")


def masked(line: str) -> str:
    line = re.sub(r"np_\S+|https?://\S+|/tmp/\S+|\d+(?:\.\d+)?", "…", line)
    line = re.sub(r"cells: .*", "cells: …", line)  # which verdicts occur depends on the CPU
    return re.sub(r"(on the fleet page as) \S+", r"\1 HOST", line)


# Where the output is shown: the README's abridged example (after its heading) and the
# demo's page of the manual, whole (after its heading).
EXAMPLES = ((README, "## What `make demo` shows"),
            (ROOT / "docs" / "getting-started" / "demo.md", "## What it prints"))


def test_the_examples_are_what_the_demo_prints(quick_start: QuickStart) -> None:
    (demo,) = [c for c in quick_start_commands() if "demo" in c]
    shown = {masked(line) for line in quick_start.output.text().splitlines()}
    for path, heading in EXAMPLES:
        example = path.read_text(encoding="utf-8").split(heading, 1)[1].split("```\n", 2)[1]
        lines = example.splitlines()
        assert lines[0] == f"$ {demo}", (path.name, lines[0])
        framed = [line for line in lines if line.startswith(FRAME)]
        assert len(framed) >= len(FRAME), (path.name, framed)
        for line in framed:
            assert masked(line) in shown, \
                f"{path.name} shows {line!r}; the demo prints no such line"
        # The fleet page's size is the code's, not the CPU's (issue 40, finding 11: the
        # README showed 12 columns where the demo printed 15).
        assert fleet_size("\n".join(lines)) == fleet_size(quick_start.output.text()), \
            path.name


def fleet_size(text: str) -> str:
    match = re.search(r"^== fleet page .*?: (\d+ nodes × \d+ workload variants, \d+ cells)",
                      text, re.M)
    assert match, text[:2000]
    return match.group(1)
