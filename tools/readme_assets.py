"""`make readme-assets`: the README's and the manual's sample of `make demo`, and the
dashboard's picture, from one real run of the demo.

It builds the manual (so the sample shows the usual `make demo`, not a first build), runs
`make demo` in this checkout as a new user's shell would (no ``NUMPARITY_*`` variables),
waits for the report and the sign-in line, opens the printed dashboard address in
Chromium (Playwright; ``/usr/bin/chromium`` or ``$NUMPARITY_CHROMIUM``), signs in with
the printed reader token and takes the fleet page whole (1400 × 900, wider when its
table needs it to show every column), then stops the demo with SIGTERM, as a service
manager would. Only when all of that worked it writes:

- ``docs/getting-started/demo.md``, the block after "What it prints": the whole output;
- ``README.md``, the block after "What `make demo` shows": the same output abridged
  (``abridge``: one line of each kind, "…" for the rest);
- ``docs/images/fleet.png``: the picture, with a ``tEXt`` chunk naming the run (its
  address and reader token), so a test can tell the picture and the sample are one run.

The checkout's own path, the one thing of this machine that is not the demo's, is shown
as ``~/numparity``. ``tests/docs/test_readme_assets.py`` checks the result against the
code; ``tests/e2e/test_quick_start.py`` against a live demo.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import struct
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DEMO_PAGE = ROOT / "docs" / "getting-started" / "demo.md"
PICTURE = ROOT / "docs" / "images" / "fleet.png"
# Where the sample is: the block after each heading (the README's abridged).
README_HEADING = "## What `make demo` shows"
DEMO_PAGE_HEADING = "## What it prints"
COMMAND = "make demo"
CHECKOUT_SHOWN = "~/numparity"
VIEWPORT = {"width": 1400, "height": 900}  # the least: wider when the table needs it
# The page's width that shows the fleet table whole: its width and the margins left of it.
WIDTH_NEEDED = """() => {
    const table = document.querySelector('#heatmap');
    const box = table.getBoundingClientRect();
    return Math.ceil(2 * (box.left + window.scrollX)
                     + Math.max(table.scrollWidth, box.width));
}"""
PICTURE_KEY = b"numparity-demo"
# Guards, not measurements: the fleet takes 1-3 minutes on two busy cores.
READY_WITHIN_S = 900
STOP_WITHIN_S = 120


# ---- the examples in the pages -------------------------------------------------------------


def _block_span(text: str, heading: str) -> tuple[int, int]:
    """Where the first fenced block after ``heading`` starts and ends (its content)."""
    at = text.index(heading)
    start = text.index("```\n", at) + len("```\n")
    return start, text.index("```\n", start)


def example(path: Path, heading: str) -> list[str]:
    """The lines of the first fenced block after ``heading`` in ``path``."""
    text = path.read_text(encoding="utf-8")
    start, end = _block_span(text, heading)
    return text[start:end].splitlines()


def replace_example(path: Path, heading: str, lines: list[str]) -> None:
    text = path.read_text(encoding="utf-8")
    start, end = _block_span(text, heading)
    path.write_text(text[:start] + "\n".join(lines) + "\n" + text[end:], encoding="utf-8")


def _is_agent_line(line: str) -> bool:
    return bool(re.match(r"^  \S+ +.* (uploaded|agent exit \d+) in [\d.]+ s$", line))


def _is_explain_line(line: str) -> bool:
    return bool(re.match(r"^  \S+ explains \S+ ", line))


def _paragraphs(lines: list[str]) -> list[list[str]]:
    found: list[list[str]] = [[]]
    for line in lines:
        if line == "":
            found.append([])
        else:
            found[-1].append(line)
    return [p for p in found if p]


def _abridge_runs(paragraph: list[str]) -> list[str]:
    """The command and server lines, the first agent run and the first explain."""
    runs = [line for line in paragraph if _is_agent_line(line)]
    explains = [line for line in paragraph if _is_explain_line(line)]
    kept = [line for line in paragraph if line not in runs and line not in explains]
    if runs:
        kept.append(runs[0])
        if len(runs) > 1:
            names = [line.split()[0] for line in runs[1:]]
            counted = [f"{name} ×{names.count(name)}" if names.count(name) > 1 else name
                       for name in dict.fromkeys(names)]
            kept.append(f"  …            ({len(names)} more runs: {', '.join(counted)})")
    if explains:
        kept.append(explains[0])
        if len(explains) > 1:
            kept.append(f"  …            ({len(explains) - 1} more explains)")
    return kept


def _first_finding(paragraph: list[str]) -> list[str]:
    """A cause, its first finding with the lines below it, and "…" for the rest."""
    kept = [paragraph[0]]
    for line in paragraph[1:]:
        if line.startswith("    ") and not line.startswith("     ") and len(kept) > 1:
            return [*kept, "  …"]
        kept.append(line)
    return kept


def _abridge_audit(paragraph: list[str]) -> list[str]:
    """Every line of the audit's own, and the first line under each of its headings."""
    kept: list[str] = []
    dropped = False
    for index, line in enumerate(paragraph):
        nested = line.startswith("    ")
        if not nested:
            if dropped:
                kept.append("    …")
            dropped = False
            kept.append(line)
        elif not paragraph[index - 1].startswith("    "):
            kept.append(line)
        else:
            dropped = True
    if dropped:
        kept.append("    …")
    return kept


def abridge(lines: list[str]) -> list[str]:
    """The README's sample from the whole output: the runs' first lines, the fleet page's
    heading, the first drill and the first split a setting explains (each with its
    first finding), the audit's lines with the first under each heading, and the end."""
    paragraphs = _paragraphs(lines)
    kept: list[list[str]] = []
    shown: set[str] = set()
    findings = False
    for paragraph in paragraphs:
        first = paragraph[0]
        if any(_is_agent_line(line) for line in paragraph):
            kept.append(_abridge_runs(paragraph))
        elif first.startswith("== fleet page"):
            kept.append(paragraph)
            findings = True
        elif first.startswith("== audit"):
            if findings and kept[-1][-1] != "  …":
                kept.append(["  …"])  # the findings left out
            kept.append(_abridge_audit(paragraph))
            findings = False
        elif findings:
            kind = ("drill" if first.startswith("  a fault drill") else
                    "setting" if first.startswith("  explained by") else "")
            if kind and kind not in shown:
                shown.add(kind)
                kept.append(_first_finding(paragraph))
        else:
            kept.append(paragraph)
    out: list[str] = []
    for paragraph in kept:
        if paragraph == ["  …"] and out:
            out.append("  …")  # under the last finding shown
            continue
        if out:
            out.append("")
        out.extend(paragraph)
    return out


# ---- the picture's tEXt chunk ------------------------------------------------------------


def png_chunks(data: bytes) -> Iterator[tuple[bytes, bytes]]:
    """(type, content) of each chunk of a PNG; ValueError when it is not one."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    at = 8
    while at < len(data):
        (length,) = struct.unpack(">I", data[at:at + 4])
        kind, content = data[at + 4:at + 8], data[at + 8:at + 8 + length]
        (crc,) = struct.unpack(">I", data[at + 8 + length:at + 12 + length])
        if zlib.crc32(kind + content) != crc:
            raise ValueError(f"chunk {kind!r}: bad CRC")
        yield kind, content
        at += 12 + length


def with_text(data: bytes, key: bytes, value: str) -> bytes:
    """The PNG with a tEXt chunk ``key``=``value`` after its header (IHDR)."""
    content = key + b"\0" + value.encode("latin-1")
    chunk = (struct.pack(">I", len(content)) + b"tEXt" + content
             + struct.pack(">I", zlib.crc32(b"tEXt" + content)))
    ihdr_end = 8 + 12 + struct.unpack(">I", data[8:12])[0]
    return data[:ihdr_end] + chunk + data[ihdr_end:]


def picture_source(data: bytes) -> str | None:
    """The run the picture was taken of (its tEXt chunk), or None."""
    for kind, content in png_chunks(data):
        if kind == b"tEXt" and content.startswith(PICTURE_KEY + b"\0"):
            return content[len(PICTURE_KEY) + 1:].decode("latin-1")
    return None


# ---- the run ------------------------------------------------------------------------------


def new_user_env() -> dict[str, str]:
    """A shell that never heard of numparity and is not inside another make."""
    return {k: v for k, v in os.environ.items() if not k.startswith("NUMPARITY_")
            and k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")}


class Output:
    """A process's output, read line by line in a thread."""

    def __init__(self, stream: Any) -> None:
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: Any) -> None:
        for line in stream:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()

    def wait_for(self, pattern: str, timeout: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for line in self.lines:
                    if match := re.search(pattern, line):
                        return match
                left = deadline - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    raise RuntimeError(f"`{COMMAND}` printed no line matching {pattern!r}:\n"
                                       + "\n".join(self.lines[-40:]))
                self._changed.wait(min(left, 1.0))

    def close(self) -> list[str]:
        self._thread.join(timeout=30)
        return list(self.lines)


def _descendants(pid: int) -> list[int]:
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
    found, pending = [], [pid]
    while pending:
        parent = pending.pop()
        for child, its_parent in parents.items():
            if its_parent == parent:
                found.append(child)
                pending.append(child)
    return found


def _demo_pid(make_pid: int) -> int:
    for pid in _descendants(make_pid):
        with contextlib.suppress(OSError):
            words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if any(w.endswith(b"numparity-server") for w in words) and b"demo" in words:
                return pid
    raise RuntimeError(f"no numparity-server demo under make ({make_pid})")


def take_picture(base_url: str, reader_token: str) -> bytes:
    """The fleet page, whole, after signing in through the token form."""
    from playwright.sync_api import sync_playwright

    chromium = os.environ.get("NUMPARITY_CHROMIUM") or "/usr/bin/chromium"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, headless=True,
                                             args=["--no-sandbox"])
        try:
            page = browser.new_context(viewport=VIEWPORT).new_page()
            page.set_default_timeout(60_000)
            page.goto(base_url + "/")
            form = page.locator("form#token-form")
            form.wait_for(state="visible")
            form.locator("input[name='token']").fill(reader_token)
            with page.expect_navigation():
                form.locator("input[name='token']").press("Enter")
            page.locator("#heatmap").wait_for(state="visible")
            page.wait_for_load_state("networkidle")
            # Wide enough for every column: the table scrolls sideways in its box, which
            # a full-page picture would cut.
            width = page.evaluate(WIDTH_NEEDED)
            if width > VIEWPORT["width"]:
                page.set_viewport_size({"width": width, "height": VIEWPORT["height"]})
                page.wait_for_load_state("networkidle")
            picture: bytes = page.screenshot(full_page=True)
        finally:
            browser.close()
    return picture


def run_demo() -> tuple[list[str], bytes, str]:
    """(the output of `make demo`, from its command line to its last line; the picture;
    the run's address and reader token)."""
    subprocess.run(["make", "--no-print-directory", "site/index.html"], cwd=ROOT,
                   env=new_user_env(), check=True, stdout=subprocess.DEVNULL)
    process = subprocess.Popen(COMMAND.split(), cwd=ROOT, env=new_user_env(), text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               start_new_session=True)
    output = Output(process.stdout)
    try:
        ready = output.wait_for(r"^Dashboard: (http://\S+)/ — sign in with the reader "
                                r"token (\S+)$", READY_WITHIN_S)
        output.wait_for(r"^Ctrl-C stops the demo", 10)
        base_url, reader_token = ready.group(1), ready.group(2)
        print(f"readme-assets: the demo serves {base_url}; taking the fleet page",
              file=sys.stderr)
        picture = take_picture(base_url, reader_token)
        os.kill(_demo_pid(process.pid), signal.SIGTERM)
        process.wait(timeout=STOP_WITHIN_S)
        lines = output.close()
    finally:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=STOP_WITHIN_S)
    if process.returncode != 0:
        raise RuntimeError(f"`{COMMAND}` exited {process.returncode}:\n" + "\n".join(lines))
    shown = [f"$ {COMMAND}", *(line.replace(str(ROOT), CHECKOUT_SHOWN) for line in lines)]
    return shown, picture, f"{base_url} {reader_token}"


def machine() -> str:
    """The machine the sample was taken on, for the page's sentence about it."""
    model = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    load = " ".join(f"{value:.1f}" for value in os.getloadavg())
    return f"{os.cpu_count()} CPUs ({model}), load average {load}"


def main() -> int:
    started = time.monotonic()
    lines, picture, source = run_demo()
    PICTURE.write_bytes(with_text(picture, PICTURE_KEY, source))
    replace_example(DEMO_PAGE, DEMO_PAGE_HEADING, lines)
    replace_example(README, README_HEADING, abridge(lines))
    for path in (DEMO_PAGE, README, PICTURE):
        print(f"readme-assets: wrote {path.relative_to(ROOT)}", file=sys.stderr)
    print(f"readme-assets: one run of `{COMMAND}` in {time.monotonic() - started:.0f} s on "
          f"{machine()}; read the pages' sentences about the run again", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
