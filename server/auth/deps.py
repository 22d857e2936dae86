"""Authentication dependencies (``ReaderAuth``, ``AgentAuth``, ``AdminAuth``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header

from numparity_server.auth.schemas import Principal
from numparity_server.auth.service import authenticate
from numparity_server.kit.deps import DbSession, SettingsDep

AuthorizationHeader = Annotated[
    str | None, Header(description="Bearer token: `Authorization: Bearer <token>`")
]


def require_reader(
    session: DbSession, settings: SettingsDep, authorization: AuthorizationHeader = None
) -> Principal:
    if settings.open_reads:
        # Trusted network: reads need no token (writes always do).
        return Principal(role="anonymous")
    return authenticate(session=session, authorization=authorization, role="reader")


def require_agent(session: DbSession, authorization: AuthorizationHeader = None) -> Principal:
    return authenticate(session=session, authorization=authorization, role="agent")


def require_admin(session: DbSession, authorization: AuthorizationHeader = None) -> Principal:
    return authenticate(session=session, authorization=authorization, role="admin")


ReaderAuth = Annotated[Principal, Depends(require_reader)]
AgentAuth = Annotated[Principal, Depends(require_agent)]
AdminAuth = Annotated[Principal, Depends(require_admin)]
