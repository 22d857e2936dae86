"""Where a form was posted from: the dashboard's sign-in and sign-out accept only their
own server's forms (login CSRF: another site signing a browser in with the attacker's
token, or signing the user out).

Browsers send ``Origin`` with every POST; ``Referer`` is the fallback where an older
browser sends no ``Origin``. The source must be this server: the host and port the
browser asked for (its ``Host`` header; the scheme is not compared, because TLS often
ends at a proxy that talks plain HTTP to the server), or the configured public URL
(``public_url``: scheme, host and port) where a proxy rewrites ``Host``. A POST naming
neither header cannot be told from a cross-site one and is refused: no browser sends
one, and a script needs no sign-in (it sends ``Authorization: Bearer``).
"""

from __future__ import annotations

from urllib.parse import urlsplit

DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin(url: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of an http(s) URL or Origin, or None (``null``, garbage)."""
    try:
        parts = urlsplit(url.strip())
        scheme = parts.scheme.lower()
        if scheme not in DEFAULT_PORTS or not parts.hostname:
            return None
        return scheme, parts.hostname.lower(), parts.port or DEFAULT_PORTS[scheme]
    except ValueError:  # a port that is not a number
        return None


def serialise(url: str) -> str:
    """``url`` as an origin (``scheme://host[:port]``) for a message, or the text as is."""
    origin = _origin(url)
    if origin is None:
        return url.strip()[:200]
    scheme, host, port = origin
    return f"{scheme}://{host}" + ("" if port == DEFAULT_PORTS[scheme] else f":{port}")


def same_origin(source: str, *, host: str | None, public_url: str | None) -> bool:
    """Whether ``source`` (an Origin or a Referer) is this server: the ``host`` the browser
    asked for, or ``public_url``."""
    origin = _origin(source)
    if origin is None:
        return False
    if public_url and origin == _origin(public_url):
        return True
    if not host:
        return False
    scheme, hostname, port = origin
    asked = _origin(f"{scheme}://{host}")  # the Host header's port defaults as the source's
    return asked == (scheme, hostname, port)
