"""The OpenAPI pages (/docs: Swagger UI, /redoc: ReDoc) in a real Chromium with every
request off this machine refused: they run from the files the package ships, under their
Content-Security-Policy (a violation is a console error, and fails the test)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from helpers.browser import Dashboard, assert_no_console_errors, screenshot

LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}
# ReDoc's sidebar credit always asks for this image; the page's policy refuses it before
# any request is made (Chromium says so on the console) and ReDoc then leaves it out.
REDOC_LOGO = "https://cdn.redoc.ly/redoc/logo-mini.svg"


@pytest.fixture
def offline_page(anonymous_page: Any) -> Any:
    """The anonymous page, with any request to another host aborted and recorded."""
    page = anonymous_page
    page.off_machine = []

    def route(route: Any) -> None:
        url = route.request.url
        scheme, host = urlsplit(url).scheme, urlsplit(url).hostname
        if scheme in ("http", "https", "ws", "wss") and host not in LOOPBACK:
            page.off_machine.append(url)
            route.abort()
        else:
            route.continue_()

    page.context.route("**/*", route)
    return page


def operations(dashboard: Dashboard) -> set[tuple[str, str]]:
    schema = httpx.get(f"{dashboard.base_url}/openapi.json", timeout=30).json()
    return {(method.upper(), path) for path, item in schema["paths"].items()
            for method in item if method in ("get", "post", "put", "delete", "patch")}


def test_swagger_ui_lists_every_operation_offline(offline_page: Any,
                                                  dashboard: Dashboard) -> None:
    page = offline_page
    response = page.goto("/docs")
    assert response is not None and response.status == 200
    upload = page.locator('.opblock-post .opblock-summary-path[data-path="/api/v1/runs"]')
    upload.wait_for(state="visible")
    shown = set()
    for block in page.locator(".opblock").all():
        method = block.locator(".opblock-summary-method").inner_text().strip()
        path = block.locator(".opblock-summary-path").get_attribute("data-path")
        shown.add((method, path))
    assert shown == operations(dashboard)
    # An operation opens and shows its parameters (Swagger UI's own code at work).
    upload.click()
    page.locator(".opblock-post.is-open .opblock-body").wait_for(state="visible")
    screenshot(page, "api-docs-swagger-ui")
    assert page.off_machine == []
    assert_no_console_errors(page)


def test_redoc_lists_every_operation_offline(offline_page: Any, dashboard: Dashboard) -> None:
    page = offline_page
    response = page.goto("/redoc")
    assert response is not None and response.status == 200
    page.locator('[data-section-id^="operation/"]').first.wait_for(state="visible")
    sections = page.locator('[data-section-id^="operation/"]').count()
    assert sections == len(operations(dashboard))
    assert page.get_by_text("/api/v1/runs", exact=True).count() >= 1
    screenshot(page, "api-docs-redoc")
    assert page.off_machine == []
    errors = page.numparity_console.take()
    assert [error for error in errors if REDOC_LOGO not in error] == [], errors
    assert page.locator('img[alt="redocly logo"]').count() == 0
