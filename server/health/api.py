"""Liveness and readiness probes."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from numparity_server.deps import DbSession
from numparity_server.kit.errors import ServiceUnavailable
from numparity_server.kit.migrate import current_revision, head_revision

router = APIRouter(tags=["health"])


class Health(BaseModel):
    status: str


class Ready(BaseModel):
    status: str
    database: str
    revision: str | None


@router.get("/healthz", response_model=Health)
async def healthz() -> Health:
    """Answered on the event loop, never queued behind the worker threads: a process
    whose threads all serve (or wait on) long reads is alive all the same."""
    return Health(status="ok")


@router.get("/readyz", response_model=Ready, responses={503: {"description": "Not ready"}})
def readyz(session: DbSession) -> Ready:
    """Ready when the database answers and its schema is at this server's head revision."""
    try:
        session.execute(text("SELECT 1"))
        revision = current_revision(session.connection())
    except SQLAlchemyError as exc:
        raise ServiceUnavailable(
            f"database unreachable: {type(getattr(exc, 'orig', None) or exc).__name__}"
        ) from None
    head = head_revision()
    if revision != head:
        raise ServiceUnavailable(
            f"database schema is at revision {revision or 'none'}, this server needs {head}: "
            "run `numparity-server migrate`"
        )
    return Ready(status="ok", database=session.get_bind().dialect.name, revision=revision)
