"""The manual at ``/manual/``, and the dashboard's links into it.

A lab's server has no internet and is installed from a wheel, so the wheel carries the
manual of its own version, built from ``docs/`` by setup.py into
``numparity_server/manual/``: the dashboard's help links open on the server itself.
``NUMPARITY_MANUAL_DIR`` serves another build instead (a checkout's ``make docs`` writes
one to ``site/``; an editable install carries none). Without either, ``/manual/`` is a
page that says how to get one.

The manual is the software's documentation, no lab data: it is served without a token,
like the sign-in page. MkDocs Material's pages run a little inline code (its start-up
script, whose text depends on the page's depth), so each HTML page is sent with a
Content-Security-Policy that allows exactly its own inline scripts by their sha256, as
the OpenAPI pages do (``api_docs``); everything else stays under the server's policy.
"""

from __future__ import annotations

import functools
from pathlib import Path

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.responses import FileResponse, Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

from numparity_server.dashboard.api_docs import _inline_hashes
from numparity_server.kit.security_headers import content_security_policy
from numparity_server.kit.settings import Settings

PREFIX = "/manual"
PACKAGED = Path(__file__).resolve().parents[1] / "manual"
# The section of the manual that explains each dashboard page (docs/reference/dashboard.md;
# tests/docs checks that each one exists in the built manual).
HELP: dict[str, str] = {
    "overview.html": "reference/dashboard/#fleet",
    "workloads.html": "reference/dashboard/#workloads",
    "workload.html": "reference/dashboard/#workload",
    "node.html": "reference/dashboard/#node",
    "compare.html": "reference/dashboard/#compare",
    "audit.html": "reference/dashboard/#audit",
}


class ManualError(ValueError):
    """NUMPARITY_MANUAL_DIR names a folder that holds no built manual."""


def manual_folder(settings: Settings) -> Path | None:
    """The built manual to serve: NUMPARITY_MANUAL_DIR, else the package's own, else
    None. ManualError when the setting names a folder without a built manual."""
    if settings.manual_dir is not None:
        folder = settings.manual_dir.expanduser()
        if not (folder / "index.html").is_file():
            raise ManualError(
                f"NUMPARITY_MANUAL_DIR={settings.manual_dir} holds no built manual (no "
                f"index.html): build one with `make docs` (it writes site/) and name that "
                f"folder, or unset it to serve the manual the package carries")
        return folder
    return PACKAGED if (PACKAGED / "index.html").is_file() else None


def help_url(template: str) -> str | None:
    """Where the manual explains the page ``template`` renders; None for a page it does
    not (the sign-in form, an error)."""
    section = HELP.get(template)
    return f"{PREFIX}/{section}" if section is not None else None


@functools.lru_cache(maxsize=512)
def _page_policy(path: str, mtime_ns: int) -> str:
    """The policy of one HTML page of the manual: its inline scripts allowed by hash."""
    html = Path(path).read_text(encoding="utf-8", errors="replace")
    return content_security_policy(script_src=("'self'", *_inline_hashes(html, "script")))


class ManualFiles(StaticFiles):
    """The built manual's files (``directory/index.html`` for ``directory/``), each HTML
    page with its own policy. A path it does not have is the dashboard's 404 page:
    MkDocs' own 404 page loads its styles from the site's root, which is not here."""

    def __init__(self, folder: Path) -> None:
        super().__init__(directory=folder, html=True)

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        if response.status_code == 404:
            raise HTTPException(status_code=404)
        if isinstance(response, FileResponse):
            page: Path | None = Path(response.path)
        elif response.status_code == 304:
            # A browser updates its cached page's headers from a 304: without the page's
            # policy here, the server's strict one would block the cached page's scripts.
            page = await run_in_threadpool(self._file_of, path)
        else:
            page = None
        if page is not None and page.suffix == ".html":
            response.headers["Content-Security-Policy"] = _page_policy(
                str(page), page.stat().st_mtime_ns)
        return response

    def _file_of(self, path: str) -> Path | None:
        """The file a request for ``path`` is answered with (a folder's index.html)."""
        found, stat = self.lookup_path(path)
        if stat is None:
            return None
        folder = Path(found)
        return folder / "index.html" if folder.is_dir() else folder
