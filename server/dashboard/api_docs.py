"""``/docs`` (Swagger UI) and ``/redoc`` (ReDoc) from the package's own copies of both
(``static/vendor``, versions and licences in its README): FastAPI's pages load them from
a CDN, a blank page on a closed lab network.

The pages are FastAPI's (``get_swagger_ui_html``, ``get_redoc_html``) pointed at the
local files. Each runs a little inline code (Swagger UI's start-up script, ReDoc's body
margin), so each page sends a Content-Security-Policy of its own that allows exactly that
code by its sha256 and nothing else inline. ReDoc also needs what its bundle does at run
time: styles it inserts (styled-components: ``'unsafe-inline'`` styles, scripts stay
strict) and its search index in a ``blob:`` worker.
"""

from __future__ import annotations

import base64
import hashlib
import re

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse

from numparity_server.kit.security_headers import content_security_policy

VENDOR = "/static/vendor"
FAVICON = f"{VENDOR}/swagger-ui-favicon-32x32.png"
_INLINE = re.compile(r"<(script|style)(?![^>]*\bsrc=)[^>]*>(.*?)</\1>", re.S)


def _inline_hashes(html: str, tag: str) -> tuple[str, ...]:
    """CSP sources (``'sha256-…'``) of the inline ``tag`` blocks of ``html``."""
    return tuple(
        "'sha256-" + base64.b64encode(hashlib.sha256(body.encode()).digest()).decode() + "'"
        for found_tag, body in _INLINE.findall(html) if found_tag == tag)


def _page(html: str, policy: str) -> HTMLResponse:
    return HTMLResponse(html, headers={"Content-Security-Policy": policy})


def install_api_docs(app: FastAPI) -> None:
    """Serve /docs and /redoc (the app is made with ``docs_url=None, redoc_url=None``)."""
    openapi_url = app.openapi_url or "/openapi.json"
    swagger = bytes(get_swagger_ui_html(
        openapi_url=openapi_url, title=f"{app.title} API", oauth2_redirect_url=None,
        swagger_js_url=f"{VENDOR}/swagger-ui-bundle.js",
        swagger_css_url=f"{VENDOR}/swagger-ui.css", swagger_favicon_url=FAVICON,
    ).body).decode()
    swagger_policy = content_security_policy(
        script_src=("'self'", *_inline_hashes(swagger, "script")))
    redoc = bytes(get_redoc_html(
        openapi_url=openapi_url, title=f"{app.title} API",
        redoc_js_url=f"{VENDOR}/redoc.standalone.js", redoc_favicon_url=FAVICON,
        with_google_fonts=False,
    ).body).decode()
    redoc_policy = content_security_policy(style_src=("'self'", "'unsafe-inline'"),
                                           worker_src=("'self'", "blob:"))

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return _page(swagger, swagger_policy)

    @app.get("/redoc", include_in_schema=False)
    async def redoc_ui() -> HTMLResponse:
        return _page(redoc, redoc_policy)
