"""Reading the dashboard's HTML in tests."""

from __future__ import annotations

from html.parser import HTMLParser

VOID = {"br", "img", "input", "meta", "link", "hr", "col", "source", "wbr"}


class Dashes(HTMLParser):
    """Every "—" in the page's text with no title on it or on an element around it."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.stack: list[tuple[str, dict[str, str | None]]] = []
        self.unexplained: list[str] = []
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in VOID:
            self.stack.append((tag, dict(attrs)))

    def handle_endtag(self, tag: str) -> None:
        while self.stack:
            if self.stack.pop()[0] == tag:
                break

    def handle_data(self, data: str) -> None:
        if "—" not in data or any(tag in ("title", "script", "pre") for tag, _ in self.stack):
            return
        explained = any(a.get("title") or "caption" in (a.get("class") or "").split()
                        for _tag, a in self.stack)
        if not explained:
            where = " > ".join(tag for tag, _ in self.stack[-4:])
            self.unexplained.append(f"{where}: {data.strip()[:80]!r}")
