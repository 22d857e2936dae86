"""Security headers on every HTTP answer: pages, the JSON API, static files, errors.

A pure ASGI middleware (no ``BaseHTTPMiddleware``: no extra task per request, streamed
bodies stay streamed). It adds each header to the response start unless the route set
it already, which lets a page that needs more (the OpenAPI pages run inline code,
allowed by its hash) send a policy of its own.

- ``Content-Security-Policy``: scripts and styles only from this server's own files (the
  dashboard has no inline code: its chart data sits in ``<script type="application/json">``
  blocks, which are data, not scripts); images from here or ``data:`` (the pages' empty
  favicon); no plugins, no ``<base>``, forms post only here, and no framing.
- ``X-Frame-Options: DENY``: no framing, for browsers older than ``frame-ancestors``.
- ``X-Content-Type-Options: nosniff``: a JSON or CSV answer is never run as a script.
- ``Referrer-Policy: same-origin``: URLs (node names, run ids) never leave for another
  site; the server's own form posts keep their ``Origin``, which sign-in checks (a
  ``no-referrer`` policy would make browsers send ``Origin: null``).
"""

from __future__ import annotations

from collections.abc import Mapping

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send


def content_security_policy(*, script_src: tuple[str, ...] = ("'self'",),
                            style_src: tuple[str, ...] = ("'self'",),
                            img_src: tuple[str, ...] = ("'self'", "data:"),
                            worker_src: tuple[str, ...] = ()) -> str:
    """The server's policy; a page that needs more names only what it adds."""
    directives = {
        "default-src": ("'self'",),
        "script-src": script_src,
        "style-src": style_src,
        "img-src": img_src,
        "font-src": ("'self'",),
        "connect-src": ("'self'",),
        "object-src": ("'none'",),
        "base-uri": ("'none'",),
        "form-action": ("'self'",),
        "frame-ancestors": ("'none'",),
        **({"worker-src": worker_src} if worker_src else {}),
    }
    return "; ".join(f"{name} {' '.join(sources)}" for name, sources in directives.items())


SECURITY_HEADERS: Mapping[str, str] = {
    "Content-Security-Policy": content_security_policy(),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}


class SecurityHeaders:
    """Adds ``headers`` (default ``SECURITY_HEADERS``) to every HTTP response that does
    not set them itself."""

    def __init__(self, app: ASGIApp, headers: Mapping[str, str] = SECURITY_HEADERS) -> None:
        self.app = app
        self.headers = dict(headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in self.headers.items():
                    headers.setdefault(name, value)
            await send(message)

        await self.app(scope, receive, send_secured)
