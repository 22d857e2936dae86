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
        return (self.status is not None and 200 <= self.status < 300
                and not self.misconfigured)

    @property
    def retry(self) -> bool:
        """Worth trying again later (unreachable, server error, throttled)."""
        if self.misconfigured:
            return False
        if self.status is None:
            return self.cause != "quarantined"
        return self.status >= 500 or self.status in (408, 429)

    @property
    def refused(self) -> bool:
        """The server refused the token (401/403): the operator must fix it; the document
        itself may be fine, so it stays in the spool. Not a refusal of the document's own
        content (`refuses_document`)."""
        return self.status in (401, 403) and not self.refuses_document

    @property
    def refuses_document(self) -> bool:
        """A 403 for what the document says, not for the token: a token bound to other
        nodes than the document's (`node_forbidden`; older servers say it in words).
        Another document of the spool may well pass."""
        return self.status == 403 and (error_code(self.detail) == "node_forbidden"
                                       or "may not write runs of node" in self.detail)

    @property
    def misconfigured(self) -> bool:
        """The URL answered, but not as numparity's API does (`not_numparity`)."""
        return self.cause == "misconfigured"


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


def error_code(text: str) -> str | None:
    """The `error` of numparity's JSON error body, None for any other body."""
    try:
        body = json.loads(text)
    except ValueError:
        return None
    code = body.get("error") if isinstance(body, dict) else None
    return code if isinstance(code, str) else None


# Statuses whose body may be anyone's: a proxy or load balancer in front of the server
# answers them for it (down, busy, too large, its own authentication).
_ANYONES = (401, 403, 407, 408, 413, 429)


def not_numparity(answer: ServerAnswer, url: str, *, expect: str) -> ServerAnswer:
    """`answer` to a request to numparity's API at `url`, marked "misconfigured" when it
    cannot have come from there: a 404 or 405 (no such route: the server's address has a
    path it should not, or names another web server), a 2xx whose JSON lacks `expect`,
    or another 4xx whose body is not numparity's JSON error. Such an answer says nothing
    of the document: it must stay in the spool until the address is right."""
    status = answer.status
    if status is None or status >= 500 or status in _ANYONES:
        return answer
    if status in (404, 405):
        wrong = True
    elif 200 <= status < 300:
        # The detail keeps the answer's first 4000 characters: a JSON object whose
        # `expect` comes early (RunCreated's run_id does) is numparity's.
        wrong = not (answer.detail.lstrip().startswith("{") and f'"{expect}"' in answer.detail)
    else:
        wrong = error_code(answer.detail) is None
    if not wrong:
        return answer
    detail = (f"{url} answered HTTP {status} ({server_message(answer.detail, 160)}), not as "
              "numparity's API does")
    return ServerAnswer(status, detail, answer.retry_after, cause="misconfigured")


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
