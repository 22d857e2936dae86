"""The README as the front door: short, the two commands first, the dashboard's picture,
and every link into the manual landing on a page and a heading that exist."""

from __future__ import annotations

import re
from pathlib import Path

from bs4 import BeautifulSoup
from helpers.manual import DOCS, REPO, page_file

README = REPO / "README.md"
LINK = re.compile(r"\]\(([^)\s]+)\)")


def readme() -> str:
    return README.read_text(encoding="utf-8")


def test_the_readme_is_short_and_starts_with_the_two_commands() -> None:
    text = readme()
    assert len(text.splitlines()) <= 250, len(text.splitlines())
    first = re.search(r"```sh\n(.*?)```", text, re.S)
    assert first is not None and text.index("```sh") < text.index("\n## ")
    commands = [line.split("#", 1)[0].strip() for line in first.group(1).splitlines()]
    assert [c for c in commands if c] == ["make demo", "make test"]


def test_the_readme_shows_the_dashboard() -> None:
    """A picture of the fleet page, committed under docs/ (the browser tests' overview.png)."""
    (image,) = re.findall(r"!\[[^\]]+\]\(([^)]+)\)", readme())
    path = REPO / image
    assert path.is_relative_to(DOCS) and path.suffix == ".png", image
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", image
    assert path.stat().st_size > 10_000, "a placeholder, not a screenshot"


def test_every_link_of_the_readme_lands(manual_site: Path) -> None:
    """Each relative link names a file of the repository; one into the manual names a page
    of the built site and, with an anchor, a heading of that page."""
    targets = [t for t in LINK.findall(readme()) if not re.match(r"[a-z]+:", t)]
    manual_links = [t for t in targets if t.startswith("docs/") and ".md" in t]
    assert len(manual_links) >= 20, manual_links
    for target in targets:
        path, _, anchor = target.partition("#")
        assert path, f"README links its own anchor {target!r}: the section moved to the manual"
        assert (REPO / path).exists(), target
        if not (path.startswith("docs/") and path.endswith(".md")):
            continue
        built = page_file(manual_site, str(Path(path).relative_to("docs")))
        assert built.is_file(), f"{target}: not a page of the manual (mkdocs.yml's nav)"
        if anchor:
            soup = BeautifulSoup(built.read_text(encoding="utf-8"), "html.parser")
            assert soup.find(id=anchor) is not None, target
