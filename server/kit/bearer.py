"""The token of an ``Authorization: Bearer <token>`` header: one reading, shared by the
token check (``auth.service``) and the byte budget (``kit.budget``), so that every
spelling authentication accepts (the scheme in any case, spaces around) is one token to
both (design §3.2)."""

from __future__ import annotations


def bearer_token(authorization: str | None) -> str | None:
    """The token, or None when the header is missing or not a bearer header."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token
