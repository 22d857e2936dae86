"""Token queries."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from numparity_server.models import Token


def find_by_sha256(session: Session, sha256: str) -> Token | None:
    return session.scalar(select(Token).where(Token.sha256 == sha256))


def get(session: Session, token_id: int) -> Token | None:
    return session.get(Token, token_id)


def list_all(session: Session) -> Sequence[Token]:
    return session.scalars(select(Token).order_by(Token.id)).all()
