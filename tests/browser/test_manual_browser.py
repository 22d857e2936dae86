"""The manual in Chromium, reached as a user reaches it: the "?" of a dashboard page
opens the section that explains the page, on the dashboard's own server, and the
manual's pages (Material's scripts, its search) run under the server's security policy
without a console error."""

from __future__ import annotations

from typing import Any

from helpers.browser import assert_no_console_errors, screenshot


def test_the_question_mark_opens_the_section_explaining_the_page(page: Any) -> None:
    for path, section, heading in (("/", "fleet", "The fleet"),
                                   ("/audit", "audit", "The audit")):
        page.goto(path)
        page.click("header.top a.help")
        page.wait_for_url(f"**/manual/reference/dashboard/#{section}")
        title = page.locator(f"h2#{section}")
        assert heading in title.inner_text()
        assert title.is_visible()
        assert_no_console_errors(page)
    screenshot(page, "manual-dashboard")


def test_the_manual_search_finds_a_guide(page: Any) -> None:
    """Material's search runs in a worker from the manual's own files (no CDN), which
    the server's policy allows."""
    page.goto("/manual/")
    page.fill("input.md-search__input", "retention")  # in the header at this width
    result = page.locator(".md-search-result__item a[href*='how-to/retention']").first
    result.wait_for(state="visible")
    result.click()
    page.wait_for_url("**/manual/how-to/retention/**")
    assert page.locator("h1").first.inner_text().strip().rstrip("¶") == "Retention"
    assert_no_console_errors(page)
