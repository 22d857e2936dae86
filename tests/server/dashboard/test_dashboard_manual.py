"""The manual at /manual/ and the dashboard's links into it: each page's "?" opens the
section that explains it, on the server itself (a lab's server has no internet), each
manual page runs only its own inline scripts, and a server without a manual says how to
get one. The manual served is the checkout's, built strictly (helpers.manual)."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from bs4 import BeautifulSoup
from fastapi.testclient import TestClient
from helpers.manual import built_manual
from helpers.processes import server_command

from numparity_server.app import create_app
from numparity_server.dashboard import manual
from numparity_server.kit.settings import Settings


@pytest.fixture(scope="module")
def site() -> Path:
    return built_manual()


@pytest.fixture
def served(site: Path, tmp_path: Path) -> TestClient:
    """A server with reads closed (the default) serving the built manual. No page here
    touches the database."""
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'unused.db'}", manual_dir=site)
    return TestClient(create_app(settings))


def help_link(html: str) -> str | None:
    link = BeautifulSoup(html, "html.parser").select_one("header.top a.help")
    return None if link is None else str(link["href"])


def test_each_page_header_opens_the_manual_section_that_explains_it(
        make_api: Callable[..., Any], site: Path) -> None:
    api = make_api(open_reads=True, manual_dir=site)
    for path, section in (("/", "fleet"), ("/workloads", "workloads"), ("/audit", "audit")):
        page = api.client.get(path)
        assert page.status_code == 200, (path, page.text[:500])
        href = help_link(page.text)
        assert href == f"/manual/reference/dashboard/#{section}", (path, href)
        soup = BeautifulSoup(page.text, "html.parser")
        assert soup.select_one('header.top nav a[href="/manual/"]') is not None, path
        target = api.client.get(href.split("#")[0])
        assert target.status_code == 200 and target.headers["content-type"].startswith(
            "text/html"), href
        heading = BeautifulSoup(target.text, "html.parser").find(id=section)
        assert heading is not None and heading.name == "h2", href
    # The sign-in form explains nothing of the fleet: no "?", the manual still in reach.
    login = api.client.get("/login")
    assert help_link(login.text) is None and 'href="/manual/"' in login.text


def inline_script_hashes(html: str) -> set[str]:
    """The CSP sources of a page's inline scripts, read with an HTML parser."""
    scripts = BeautifulSoup(html, "html.parser").find_all("script", src=False)
    return {"'sha256-" + base64.b64encode(hashlib.sha256(
        script.string.encode()).digest()).decode() + "'" for script in scripts if script.string}


def test_a_manual_page_may_run_its_own_inline_scripts_and_nothing_else(
        served: TestClient) -> None:
    for path in ("/manual/", "/manual/reference/dashboard/", "/manual/design/"):
        page = served.get(path)
        assert page.status_code == 200, path
        policy = dict(directive.strip().split(" ", 1)
                      for directive in page.headers["content-security-policy"].split(";"))
        sources = set(policy["script-src"].split())
        assert sources == {"'self'"} | inline_script_hashes(page.text), path
        assert "'unsafe-inline'" not in page.headers["content-security-policy"]
        assert policy["frame-ancestors"] == "'none'" and policy["default-src"] == "'self'"
        # A browser revalidating its cached copy takes the 304's headers for the page's:
        # the strict policy there would block the page's scripts (Chromium did).
        again = served.get(path, headers={"If-None-Match": page.headers["etag"]})
        assert again.status_code == 304, path
        assert again.headers["content-security-policy"] == \
            page.headers["content-security-policy"], path
    # Its styles and scripts are files of the package's manual, under the strict policy.
    soup = BeautifulSoup(served.get("/manual/").text, "html.parser")
    sheet = next(str(link["href"]) for link in soup.select('link[rel="stylesheet"]'))
    asset = served.get(f"/manual/{sheet}")
    assert asset.status_code == 200 and asset.headers["content-type"].startswith("text/css")
    assert "sha256" not in asset.headers["content-security-policy"]


def test_the_manual_needs_no_token_where_reads_are_closed(served: TestClient) -> None:
    """It is the software's documentation, not lab data; the pages still ask."""
    assert served.get("/manual/how-to/retention/").status_code == 200
    fleet = served.get("/", follow_redirects=False)
    assert fleet.status_code == 303 and fleet.headers["location"].startswith("/login")


def test_a_page_the_manual_does_not_have_is_the_dashboards_404(served: TestClient) -> None:
    missing = served.get("/manual/how-to/nowhere/")
    assert missing.status_code == 404
    assert "there is no page at /manual/how-to/nowhere/" in missing.text
    assert served.get("/manual", follow_redirects=False).headers["location"].endswith(
        "/manual/")


def test_without_a_manual_the_links_say_how_to_get_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An editable install carries no built manual (a wheel does)."""
    monkeypatch.setattr(manual, "PACKAGED", tmp_path / "no-manual")
    client = TestClient(create_app(Settings(database_url=f"sqlite:///{tmp_path / 'x.db'}")))
    for path in ("/manual/", "/manual/reference/dashboard/"):
        page = client.get(path)
        assert page.status_code == 404, path
        assert "No manual on this server" in page.text
        assert "make docs" in page.text and "NUMPARITY_MANUAL_DIR" in page.text


def test_a_manual_dir_without_a_manual_stops_serve_naming_it(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {**os.environ, "NUMPARITY_MANUAL_DIR": str(empty),
           "NUMPARITY_DATABASE_URL": f"sqlite:///{tmp_path / 'x.db'}"}
    done = subprocess.run([*server_command(), "serve", "--port", "1"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert f"NUMPARITY_MANUAL_DIR={empty} holds no built manual" in done.stderr
    assert "make docs" in done.stderr and "Traceback" not in done.stderr
