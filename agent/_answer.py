"""What an upload's answer means: a ServerAnswer, from an HTTP answer or from the
error of a request that got none (unreachable, or a certificate the agent cannot
verify), and the TLS settings those requests are made with."""

from __future__ import annotations

import email.utils
import json
import ssl
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

# What httpx's `verify` takes: True (the bundled CAs), or a context with the lab's CA.
Verify = ssl.SSLContext | bool


def tls_verify(ca_bundle: Path | str | None) -> Verify:
    """`verify` for httpx: the default CAs, or only those in `ca_bundle` (a PEM file with
    the lab's own CA). Raises OSError or ssl.SSLError when the file cannot be used."""
    if ca_bundle is None:
        return True
    return ssl.create_default_context(cafile=str(ca_bundle))


@dataclass(frozen=True)
class ServerAnswer:
    """`status` is the HTTP status, or None when there was no answer: then `cause` says
    why ("unreachable", "tls": the certificate or the handshake failed, "quarantined":
    the spool file is not a run document). `retry_after` is the server's Retry-After in
    seconds, when it sent one."""

    status: int | None
    detail: str
    retry_after: float | None = None
    cause: str = ""

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300

    @property
    def retry(self) -> bool:
        """Worth trying again later (unreachable, server error, throttled)."""
        if self.status is None:
            return self.cause != "quarantined"
        return self.status >= 500 or self.status in (408, 429)

    @property
    def refused(self) -> bool:
        """The server refused the token (401/403): the operator must fix it; the document
        itself may be fine, so it stays in the spool."""
        return self.status in (401, 403)


def retry_after_seconds(value: str | None) -> float | None:
    """Retry-After in seconds: a number of seconds or an HTTP date (RFC 9110)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def server_message(text: str, limit: int = 300) -> str:
    """The server's error body in one line: `code: detail` from its JSON errors."""
    try:
        body = json.loads(text)
    except ValueError:
        return " ".join(text.split())[:limit]
    if isinstance(body, dict) and ("error" in body or "detail" in body):
        detail = body.get("detail")
        if not isinstance(detail, str):
            detail = json.dumps(detail, separators=(",", ":"))
        return (f"{body.get('error', 'error')}: {detail}")[:limit]
    return " ".join(text.split())[:limit]


def no_answer(url: str, exc: httpx.HTTPError) -> ServerAnswer:
    """An ServerAnswer for a request that got no HTTP answer."""
    chain: list[BaseException] = []
    error: BaseException | None = exc
    while error is not None and len(chain) < 8:
        chain.append(error)
        error = error.__cause__ or error.__context__
    certificate = next((e for e in chain if isinstance(e, ssl.SSLCertVerificationError)), None)
    if certificate is not None or "CERTIFICATE_VERIFY_FAILED" in str(exc):
        reason = getattr(certificate, "verify_message", None) or str(certificate or exc)
        return ServerAnswer(None, f"{url}: the server's TLS certificate could not be "
                             f"verified ({reason}); if the lab signs it with its own CA, "
                             "pass --ca-bundle FILE (or NUMPARITY_CA_BUNDLE, or ca_bundle in "
                             "the config file)", cause="tls")
    if any(isinstance(e, ssl.SSLError) for e in chain):
        return ServerAnswer(None, f"{url}: TLS handshake failed: {exc}", cause="tls")
    return ServerAnswer(None, f"{url} unreachable: {type(exc).__name__}: {exc}",
                         cause="unreachable")


def answer_of(response: httpx.Response) -> ServerAnswer:
    return ServerAnswer(response.status_code, response.text[:4000],
                         retry_after=retry_after_seconds(response.headers.get("Retry-After")))
