"""Plumbing dependencies: the request's settings and database session."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session

from numparity_server.kit.settings import Settings


def get_request_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def get_session(request: Request) -> Iterator[Session]:
    """One session per request; services commit what they write, the rest rolls back."""
    session: Session = request.app.state.session_factory()
    try:
        yield session
    finally:
        session.close()


SettingsDep = Annotated[Settings, Depends(get_request_settings)]
DbSession = Annotated[Session, Depends(get_session)]
