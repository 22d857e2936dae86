"""The manual as `make docs` builds it: strictly (no broken link or anchor, no page left
out of the navigation), loading nothing from another host, and holding the section each
dashboard page's "?" opens."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from bs4 import BeautifulSoup
from helpers.manual import DOCS, REPO, build_manual, page_file

from numparity_server.dashboard import manual

TEMPLATES = REPO / "server" / "dashboard" / "templates"


def pages() -> list[str]:
    return sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")
                  if "_gen" not in p.parts)


def test_every_page_of_docs_is_a_page_of_the_site(manual_site: Path) -> None:
    assert {"index.md", "design.md", "reference/cli-agent.md",
            "reference/settings.md"} <= set(pages())
    for source in pages():
        assert page_file(manual_site, source).is_file(), source
    # The generator is not a page, nor copied into the site.
    assert not list(manual_site.rglob("*.py"))


def test_the_strict_build_fails_on_a_broken_link_anchor_or_a_page_outside_the_navigation(
        tmp_path: Path) -> None:
    """What `make docs` and `make test` must refuse: each named in the build's output."""
    shutil.copy(REPO / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(DOCS, tmp_path / "docs", ignore=shutil.ignore_patterns("_gen"))
    with (tmp_path / "docs" / "index.md").open("a", encoding="utf-8") as index:
        index.write("\n[gone](design.md#no-such-section) and [missing](how-to/nowhere.md)\n")
    (tmp_path / "docs" / "orphan.md").write_text("# Not in the navigation\n")
    done = build_manual(tmp_path / "site", root=tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "no-such-section" in output, output
    assert "how-to/nowhere.md" in output, output
    assert "orphan.md" in output, output


def test_the_design_keeps_its_github_anchors(manual_site: Path) -> None:
    """design.md's own table of contents and the README link to GitHub's anchors (an em
    dash makes a double hyphen): the site's headings carry the same ones."""
    html = page_file(manual_site, "design.md").read_text(encoding="utf-8")
    linked = set(re.findall(r"\]\(#([^)]+)\)", (DOCS / "design.md").read_text("utf-8")))
    assert "33-analysis--what-the-numbers-mean" in linked
    ids = {tag["id"] for tag in BeautifulSoup(html, "html.parser").select("[id]")}
    assert linked <= ids, sorted(linked - ids)


def test_the_manual_loads_nothing_from_another_host(manual_site: Path) -> None:
    """A lab's network has no internet: no web font, script, style or image from a CDN."""
    for page in manual_site.rglob("*.html"):
        soup = BeautifulSoup(page.read_text(encoding="utf-8"), "html.parser")
        for tag, attribute in (("script", "src"), ("link", "href"), ("img", "src")):
            for element in soup.find_all(tag):
                url = str(element.get(attribute) or "")
                assert not re.match(r"(https?:)?//", url), (page, str(element))
    for sheet in manual_site.rglob("*.css"):
        assert not re.search(r"url\(\s*['\"]?(https?:)?//", sheet.read_text("utf-8")), sheet
        assert "@import" not in sheet.read_text("utf-8"), sheet


def test_each_dashboard_page_links_a_section_of_the_manual(manual_site: Path) -> None:
    """The "?" of every page the dashboard renders opens a section that exists."""
    pages_rendered = {t.name for t in TEMPLATES.glob("*.html")
                      if not t.name.startswith("_")} - {"base.html", "error.html", "login.html"}
    assert pages_rendered == set(manual.HELP), "a dashboard page without its manual section"
    for template in sorted(pages_rendered):
        url = manual.help_url(template)
        assert url is not None and url.startswith("/manual/"), template
        path, _, section = url.removeprefix("/manual/").partition("#")
        built = manual_site / path / "index.html"
        assert built.is_file(), (template, url)
        soup = BeautifulSoup(built.read_text(encoding="utf-8"), "html.parser")
        heading = soup.find(id=section)
        assert heading is not None and heading.name in ("h2", "h3"), (template, url)
