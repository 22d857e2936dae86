"""Tokens: random, shown once, stored as sha256 (design §3.2)."""

from __future__ import annotations

import hashlib
import secrets

from sqlalchemy.orm import Session

from numparity_server.auth import repository
from numparity_server.auth.schemas import ROLES, CreatedToken, Principal, Role, TokenOut
from numparity_server.kit.db import writing
from numparity_server.kit.errors import BadRequest, Forbidden, NotFound, Unauthorized
from numparity_server.models import Token, utcnow

AUTH_HEADER_HINT = "send the header 'Authorization: Bearer <token>'"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def create_token(*, session: Session, role: str, label: str = "") -> CreatedToken:
    if role not in ROLES:
        raise BadRequest(f"unknown role {role!r}; roles are {', '.join(ROLES)}")
    # 32 random bytes; the "np_" prefix makes a leaked token easy to recognise in logs.
    token = "np_" + secrets.token_urlsafe(32)
    row = Token(sha256=hash_token(token), role=role, label=label)
    with writing(session):
        session.add(row)
    return CreatedToken(id=row.id, role=row.role, label=row.label, token=token)


def list_tokens(*, session: Session) -> list[TokenOut]:
    return [TokenOut.model_validate(row, from_attributes=True)
            for row in repository.list_all(session)]


def revoke_token(*, session: Session, token_id: int) -> TokenOut:
    with writing(session):
        row = repository.get(session, token_id)
        if row is None:
            raise NotFound(f"no token with id {token_id}")
        if row.revoked_at is None:
            row.revoked_at = utcnow()
    return TokenOut.model_validate(row, from_attributes=True)


def parse_bearer(authorization: str | None) -> str:
    if not authorization:
        raise Unauthorized(f"missing Authorization header: {AUTH_HEADER_HINT}")
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized(f"malformed Authorization header: {AUTH_HEADER_HINT}")
    return token.strip()


def authenticate(*, session: Session, authorization: str | None, role: Role) -> Principal:
    """The principal behind an Authorization header, if it may act as ``role``."""
    token = parse_bearer(authorization)
    row = repository.find_by_sha256(session, hash_token(token))
    if row is None:
        raise Unauthorized("unknown token")
    if row.revoked_at is not None:
        raise Unauthorized("token revoked")
    principal = Principal(role=row.role, token_id=row.id, label=row.label)  # type: ignore[arg-type]
    if not principal.has(role):
        raise Forbidden(f"this endpoint needs the {role} role; the token has the {row.role} role")
    return principal
