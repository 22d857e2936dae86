"""The README's sample of `make demo`, the manual's whole one and the picture of the fleet
page are one real run's (`make readme-assets`, tools/readme_assets.py) and what this
code runs and prints, checked without running the demo: the line make prints, the fleet
(its nodes, runs and explains), the fleet page's size (issue 40, finding 11: 12 columns
shown, 15 printed), what the demo says at the end, and the picture taken of that run.

Which cells differ depends on the CPU the sample was taken on; that the report's lines
are what the demo prints is checked against a live demo by ``tests/e2e/test_quick_start.py``.
"""

from __future__ import annotations

import importlib.util
import os
import re
import struct
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from helpers.manual import REPO

pytest.importorskip("numparity_server")

from numparity_server.demo import (  # noqa: E402
    EXPLAINER,
    FLEET,
    RUN_WORKLOADS,
    Tokens,
    your_node_lines,
)


def _load_tool() -> ModuleType:
    name = "numparity_readme_assets"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "tools" / "readme_assets.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


assets = _load_tool()


def whole() -> list[str]:
    return list(assets.example(assets.DEMO_PAGE, assets.DEMO_PAGE_HEADING))


def test_the_readme_shows_the_manuals_sample_abridged() -> None:
    assert assets.example(assets.README, assets.README_HEADING) == assets.abridge(whole())


def test_the_sample_starts_with_the_line_make_prints() -> None:
    env = {k: v for k, v in os.environ.items()
           if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")}
    env.pop("VENV", None)
    # -n: what make would print, running nothing; -o: the venv and the manual as built.
    dry = subprocess.run(["make", "-n", "--no-print-directory", "-o",
                          ".venv/.numparity-installed", "-o", "site/index.html", "demo"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
                         check=True)
    echoed = [line.replace(str(REPO), assets.CHECKOUT_SHOWN)
              for line in dry.stdout.splitlines()]
    lines = whole()
    assert lines[0] == f"$ {assets.COMMAND}"
    assert lines[1:1 + len(echoed)] == echoed, (lines[:3], echoed)


def test_the_sample_runs_this_codes_fleet() -> None:
    lines = whole()
    runs = [line for line in lines if re.search(r" uploaded in [\d.]+ s$", line)]
    expected = [f"  {node.name:<12} {node.why:<32} uploaded in "
                for node in FLEET for _ in range(node.runs)]
    assert len(runs) == len(expected), runs
    for line, start in zip(runs, expected, strict=True):
        assert line.startswith(start), (line, start)
    explains = [line for line in lines if " explains " in line and line.startswith("  ")]
    assert [line.split()[2] for line in explains] == [n.name for n in FLEET if n.env]
    assert all(line.startswith(f"  {EXPLAINER} explains ") for line in explains), explains


def test_the_fleet_page_has_this_codes_size() -> None:
    """Nodes × columns (every workload the fleet runs, under every variant a node runs
    that the workload runs under: `data` only under default), and the verdict counts
    adding up to the cells; findings name those columns."""
    pytest.importorskip("torch")
    from numparity_agent import _workloads

    lines = whole()
    variants = {variant for node in FLEET for variant in node.variants}
    columns = {f"{workload}/{variant}" for workload in RUN_WORKLOADS for variant in variants
               if _workloads.load(workload).skip_reason(variant) is None}
    (header,) = [line for line in lines if line.startswith("== fleet page")]
    match = re.search(r": (\d+) nodes × (\d+) workload variants, (\d+) cells: (.*)$", header)
    assert match, header
    nodes, shown_columns, cells = (int(match.group(i)) for i in (1, 2, 3))
    assert (nodes, shown_columns, cells) == (len(FLEET), len(columns),
                                             len(FLEET) * len(columns)), header
    counts = re.findall(r"(\d+) (\w+)", match.group(4))
    assert sum(int(count) for count, _verdict in counts) == cells, header
    findings = [line.split()[0] for line in lines
                if re.match(r"^    \S+/\S+ +(equivalent|divergent|nonfinite|missing|failed)",
                            line)]
    assert findings and set(findings) <= columns, set(findings) - columns


def test_the_sample_ends_with_what_the_demo_says() -> None:
    lines = whole()
    ready = next(re.match(r"^Dashboard: (http://\S+)/ — sign in with the reader token (\S+)$",
                          line) for line in lines if line.startswith("Dashboard: "))
    assert ready, lines[-8:]
    agent = next(line for line in lines if line.startswith("  NUMPARITY_TOKEN="))
    yours = agent.split()[0].split("=", 1)[1]
    workdir = Path(re.search(r"--spool (\S+)/spool-yours", agent).group(1))  # type: ignore[union-attr]
    said = your_node_lines(base_url=ready.group(1), workdir=workdir, kept=False,
                           tokens=Tokens(fleet="", yours=yours, reader=ready.group(2)))

    def masked(line: str) -> str:
        # The agent's path is relative to where the demo ran; the host is the machine's.
        line = re.sub(r"\S*numparity(-agent| -m numparity_agent)", "numparity-agent", line)
        return re.sub(r"(on the fleet page as) \S+", r"\1 HOST", line)

    start = lines.index(said[0])
    assert [masked(line) for line in lines[start:start + len(said)]] == \
        [masked(line) for line in said]
    assert lines[start + len(said):] == [f"numparity demo: stopped; removed {workdir}."]
    assert any(line.startswith(f"== fleet page ({ready.group(1)}/): ") for line in lines)


def test_the_picture_is_of_the_samples_run() -> None:
    """A whole PNG of the fleet page, at least the tool's width, taken of the run the sample
    shows (its address and reader token in the picture's tEXt chunk), and shown by the
    README and the manual."""
    data = assets.PICTURE.read_bytes()
    chunks = list(assets.png_chunks(data))  # a PNG, every chunk's CRC right
    kind, header = chunks[0]
    width, height = struct.unpack(">II", header[:8])
    assert kind == b"IHDR" and width >= assets.VIEWPORT["width"], (kind, width)
    assert height >= assets.VIEWPORT["height"] and len(data) > 50_000, (height, len(data))
    assert chunks[-1][0] == b"IEND"
    source = assets.picture_source(data)
    assert source, "no tEXt chunk: not taken by make readme-assets"
    base_url, reader = source.split()
    assert f"Dashboard: {base_url}/ — sign in with the reader token {reader}" in whole()
    picture = assets.PICTURE.relative_to(REPO)
    assert f"]({picture})" in assets.README.read_text(encoding="utf-8")
    for page in (assets.DEMO_PAGE, REPO / "docs" / "index.md"):
        relative = os.path.relpath(assets.PICTURE, page.parent)
        assert f"]({relative})" in page.read_text(encoding="utf-8"), page
