"""Helpers of the browser tests: where Chromium is, console recording, screenshots.

Imported by ``tests/browser/conftest.py`` and the tests (as ``helpers.browser``, like
``helpers.e2e``); it never imports Playwright at module level, so the folder is skipped,
not broken, where Playwright is missing.
"""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM_ENV = "NUMPARITY_CHROMIUM"
DEFAULT_CHROMIUM = "/usr/bin/chromium"
SCREENSHOTS_ENV = "NUMPARITY_SCREENSHOTS"
DEFAULT_SCREENSHOTS = Path(__file__).resolve().parents[1] / "browser" / "screenshots"
# CI (.ci/run) installs Chromium and Playwright and sets this: there a missing browser
# fails the tests instead of skipping them.
REQUIRED_ENV = "NUMPARITY_BROWSER_TESTS"

TESTS_DIR = Path(__file__).resolve().parents[1]


def chromium_path() -> str:
    return os.environ.get(CHROMIUM_ENV) or DEFAULT_CHROMIUM


def missing_requirement() -> str | None:
    """Why the browser tests cannot run here, or None when they can."""
    path = chromium_path()
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        source = f"${CHROMIUM_ENV}" if os.environ.get(CHROMIUM_ENV) else "the default"
        return (f"no Chromium at {path} ({source}; install Debian's `chromium` package or "
                f"set {CHROMIUM_ENV})")
    if importlib.util.find_spec("playwright") is None:
        return "Playwright is not installed (pip install -e '.[browser]')"
    return None


def browser_tests_required() -> bool:
    return os.environ.get(REQUIRED_ENV, "").lower() == "required"


def screenshots_dir() -> Path:
    folder = Path(os.environ.get(SCREENSHOTS_ENV) or DEFAULT_SCREENSHOTS)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def screenshot(page: Any, name: str) -> Path:
    """A full-page PNG of what the browser shows, in the screenshots folder."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-")
    path = screenshots_dir() / f"{safe}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


_FAILED_RESOURCE = re.compile(r"^Failed to load resource: the server responded with a status")


@dataclass
class ConsoleRecorder:
    """Console errors and uncaught exceptions of one page.

    Chromium logs "Failed to load resource" for a document that answers 4xx; the token
    prompt (401) and the 404/422 pages do so on purpose, and the tests check their
    status, so that message is not an error for a navigation's own document. The same
    message for a script, stylesheet or fetch is.
    """

    errors: list[str] = field(default_factory=list)
    error_documents: set[str] = field(default_factory=set)

    def attach(self, page: Any) -> None:
        page.on("console", self._on_console)
        page.on("pageerror", lambda exc: self.errors.append(f"uncaught exception: {exc}"))
        page.on("response", lambda response: self._on_response(page, response))

    def _on_response(self, page: Any, response: Any) -> None:
        request = response.request
        if (response.status >= 400 and request.is_navigation_request()
                and request.resource_type == "document" and response.frame == page.main_frame):
            self.error_documents.add(response.url)

    def _on_console(self, message: Any) -> None:
        if message.type != "error":
            return
        url = (message.location or {}).get("url", "")
        if _FAILED_RESOURCE.match(message.text) and url in self.error_documents:
            return
        where = f" ({url}:{(message.location or {}).get('lineNumber', 0)})" if url else ""
        self.errors.append(f"console error: {message.text}{where}")

    def take(self) -> list[str]:
        errors, self.errors = self.errors, []
        return errors


def assert_no_console_errors(page: Any) -> None:
    """Fails with every console error and uncaught exception the page has had so far."""
    recorder: ConsoleRecorder = page.numparity_console
    errors = recorder.take()
    assert not errors, f"{page.url}: " + "\n".join(errors)


# How much a canvas drew: the number of pixels that are not fully transparent. uPlot
# sizes the canvas by devicePixelRatio, so its own width and height are used.
CANVAS_INK_JS = """(selector) => {
  const canvas = document.querySelector(selector);
  if (!canvas || !canvas.width || !canvas.height) return 0;
  const data = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
  let ink = 0;
  for (let i = 3; i < data.length; i += 4) if (data[i] !== 0) ink++;
  return ink;
}"""


def canvas_ink(page: Any, selector: str) -> int:
    return int(page.evaluate(CANVAS_INK_JS, selector))


def wait_for_chart(page: Any, selector: str, timeout_ms: float = 15_000) -> dict[str, float]:
    """Waits until the canvas at ``selector`` has a size and drew pixels; its box."""
    canvas = page.locator(selector).first
    canvas.wait_for(state="visible", timeout=timeout_ms)
    page.wait_for_function(f"(s) => ({CANVAS_INK_JS})(s) > 0", arg=selector, timeout=timeout_ms)
    box = canvas.bounding_box()
    assert box is not None, f"{selector} is not laid out"
    return box


def login(page: Any, token: str) -> Any:
    """Fills the token form the page shows and submits it; the response it lands on."""
    form = page.locator("form#token-form")
    form.wait_for(state="visible")
    form.locator("input[name='token']").fill(token)
    with page.expect_navigation() as navigation:
        form.locator("input[name='token']").press("Enter")
    return navigation.value


@dataclass(frozen=True)
class Dashboard:
    """The real server the browser talks to, on the demo fleet's database."""

    base_url: str
    database_url: str
    reader_token: str
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
