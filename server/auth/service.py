"""Tokens: random, shown once, stored as sha256 (design §3.2)."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence

from sqlalchemy.orm import Session

from numparity_server.auth import repository
from numparity_server.auth.schemas import (
    ROLES,
    CreatedToken,
    Principal,
    Role,
    TokenOut,
    binding_text,
)
from numparity_server.kit.bearer import bearer_token
from numparity_server.kit.db import writing
from numparity_server.kit.errors import BadRequest, Forbidden, NotFound, Unauthorized
from numparity_server.kit.names import name_problem
from numparity_server.models import Token, utcnow

AUTH_HEADER_HINT = "send the header 'Authorization: Bearer <token>'"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


# A node name's longest (the run document's ``node.name``); a pattern is held to it too.
NODE_NAME_MAX = 255


def create_token(*, session: Session, role: str, label: str = "",
                 node_names: Sequence[str] = (), node_patterns: Sequence[str] = ()
                 ) -> CreatedToken:
    """A new token, bound to ``node_names`` and ``node_patterns`` (agent tokens only)
    when either is given, else unbound."""
    if role not in ROLES:
        raise BadRequest(f"unknown role {role!r}; roles are {', '.join(ROLES)}")
    names, patterns = _binding("node name", node_names), _binding("node pattern", node_patterns)
    if (names or patterns) and role != "agent":
        raise BadRequest(f"only agent tokens are bound to nodes; a {role} token cannot be")
    # 32 random bytes; the "np_" prefix makes a leaked token easy to recognise in logs.
    token = "np_" + secrets.token_urlsafe(32)
    row = Token(sha256=hash_token(token), role=role, label=label, node_names=names,
                node_patterns=patterns)
    with writing(session, changes_answers=False):
        session.add(row)
    return CreatedToken(id=row.id, role=row.role, label=row.label, token=token,
                        node_names=row.node_names, node_patterns=row.node_patterns)


def _binding(what: str, values: Sequence[str]) -> list[str] | None:
    """The distinct values in their order; None for none (stored as NULL: unbound)."""
    for value in values:
        if not value or len(value) > NODE_NAME_MAX:
            raise BadRequest(f"a {what} has 1 to {NODE_NAME_MAX} characters, not "
                             f"{len(value)}")
        problem = name_problem(value)
        if problem is not None:
            raise BadRequest(f"the {what} {value!r} {problem}")
    return list(dict.fromkeys(values)) or None


def list_tokens(*, session: Session) -> list[TokenOut]:
    return [TokenOut.model_validate(row, from_attributes=True)
            for row in repository.list_all(session)]


def revoke_token(*, session: Session, token_id: int) -> TokenOut:
    with writing(session, changes_answers=False):
        row = repository.get(session, token_id)
        if row is None:
            raise NotFound(f"no token with id {token_id}")
        if row.revoked_at is None:
            row.revoked_at = utcnow()
    return TokenOut.model_validate(row, from_attributes=True)


def parse_bearer(authorization: str | None) -> str:
    if not authorization:
        raise Unauthorized(f"missing Authorization header: {AUTH_HEADER_HINT}")
    token = bearer_token(authorization)
    if token is None:
        raise Unauthorized(f"malformed Authorization header: {AUTH_HEADER_HINT}")
    return token


def authenticate(*, session: Session, authorization: str | None, role: Role) -> Principal:
    """The principal behind an Authorization header, if it may act as ``role``."""
    token = parse_bearer(authorization)
    row = repository.find_by_sha256(session, hash_token(token))
    if row is None:
        raise Unauthorized("unknown token")
    if row.revoked_at is not None:
        raise Unauthorized("token revoked")
    principal = Principal(role=row.role, token_id=row.id, label=row.label,  # type: ignore[arg-type]
                          node_names=tuple(row.node_names or ()),
                          node_patterns=tuple(row.node_patterns or ()))
    if not principal.has(role):
        raise Forbidden(f"this endpoint needs the {role} role; the token has the {row.role} role")
    return principal


def require_node(principal: Principal, node: str, *, what: str = "runs") -> None:
    """Refuse (403) ``what`` (runs, explanations) of ``node`` from a token bound to other
    nodes (design §3.6)."""
    if principal.may_write_node(node):
        return
    shown = node if len(node) <= 100 else node[:100] + "…"
    raise Forbidden(f"token {principal.token_id} is bound to "
                    f"{binding_text(principal.node_names, principal.node_patterns)}: it may "
                    f"not write {what} of node {shown!r}")
