"""Every FastAPI dependency a route needs, in one place: the request's settings, database
session and policy, the caller's role, and pagination. Services never import this
module (nor FastAPI): routes resolve these and pass plain values on."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import Annotated, Literal, TypeVar

from fastapi import Depends, Query, Request, Response, Security
from fastapi.security import HTTPBearer
from sqlalchemy.orm import Session

from numparity_server.analysis.policy import Policy
from numparity_server.auth.schemas import Principal
from numparity_server.auth.service import authenticate
from numparity_server.kit.compute import Budget, Computations
from numparity_server.kit.db import release, snapshot
from numparity_server.kit.errors import InvalidDocument, NotFound
from numparity_server.kit.ingest_meter import IngestMeter
from numparity_server.kit.pagination import MAX_OFFSET, PageParams
from numparity_server.kit.readcache import ReadCache
from numparity_server.kit.settings import Settings
from numparity_server.reads.fleet_version import fleet_version


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


def get_policy(request: Request) -> Policy:
    policy: Policy = request.app.state.policy
    return policy


SettingsDep = Annotated[Settings, Depends(get_request_settings)]
DbSession = Annotated[Session, Depends(get_session)]
PolicyDep = Annotated[Policy, Depends(get_policy)]

T = TypeVar("T")


class Kept:
    """A fleet-wide read's answer kept against the fleet's version (`kit.readcache`):
    ``kept(key, compute)`` is ``compute()``, or the answer it gave at this version. The
    answer's age goes out as the HTTP ``Age`` header (``headers``, for a route that makes
    its own response)."""

    def __init__(self, cache: ReadCache, session: Session, response: Response) -> None:
        self._cache, self._session, self._response = cache, session, response
        self.headers: dict[str, str] = {}

    def __call__(self, key: Hashable, compute: Callable[[], T],
                 keep: Callable[[T], bool] | None = None) -> T:
        version = fleet_version(self._session)
        # Another asker of ``key`` may be computing it: wait holding no connection.
        release(self._session)

        def at_one_snapshot() -> T:
            # Its statements see one state of the fleet (kit.db.snapshot), at least as new
            # as ``version``: an answer kept against ``version`` is never older than it.
            with snapshot(self._session):
                return compute()

        cached = self._cache.get(key, version, at_one_snapshot, keep)
        self.headers["Age"] = str(int(cached.age_s))
        self._response.headers.update(self.headers)
        return cached.value  # type: ignore[no-any-return]


def kept_reads(request: Request, response: Response, session: DbSession) -> Kept:
    return Kept(request.app.state.read_cache, session, response)


KeptReads = Annotated[Kept, Depends(kept_reads)]


def read_budget(request: Request) -> Budget:
    """The request's budget of heavy computations (kit.compute)."""
    computations: Computations = request.app.state.computations
    return computations.request()


ReadBudget = Annotated[Budget, Depends(read_budget)]

class BearerToken(HTTPBearer):
    """The ``Authorization`` header as sent: ``authenticate`` tells a missing header from a
    malformed one. Declared as HTTPBearer so the OpenAPI schema names the bearer scheme
    (and the routes that need it)."""

    async def __call__(self, request: Request) -> str | None:  # type: ignore[override]
        return request.headers.get("authorization")


AuthorizationHeader = Annotated[
    str | None,
    Security(BearerToken(auto_error=False,
                         description="`Authorization: Bearer <token>`, a token made by "
                                     "`numparity-server token create`")),
]


def require_reader(
    session: DbSession, settings: SettingsDep, authorization: AuthorizationHeader = None
) -> Principal:
    if settings.open_reads:
        # Trusted network: reads need no token (writes always do).
        return Principal(role="anonymous")
    try:
        return authenticate(session=session, authorization=authorization, role="reader")
    finally:
        # The connection goes back to the pool until the route runs: between two of a
        # request's sync steps it waits for a worker thread, and holding a connection
        # then, 45 readers held all 15 while the threads waited for connections.
        release(session)


def require_agent(session: DbSession, authorization: AuthorizationHeader = None) -> Principal:
    try:
        return authenticate(session=session, authorization=authorization, role="agent")
    finally:
        # The token check's transaction ends here and its connection goes back to the
        # pool: an agent's route decodes and validates its body before it writes, and
        # holds no connection meanwhile (the body itself arrived before: kit.limits).
        session.rollback()


def require_check(session: DbSession, authorization: AuthorizationHeader = None) -> Principal:
    """A token that may read `check`'s plan: a check token (it writes nothing: what a
    training job's init container holds), an agent's or an admin's."""
    try:
        return authenticate(session=session, authorization=authorization, role="check")
    finally:
        session.rollback()


def require_admin(session: DbSession, authorization: AuthorizationHeader = None) -> Principal:
    return authenticate(session=session, authorization=authorization, role="admin")


ReaderAuth = Annotated[Principal, Depends(require_reader)]
AgentAuth = Annotated[Principal, Depends(require_agent)]
AdminAuth = Annotated[Principal, Depends(require_admin)]
CheckAuth = Annotated[Principal, Depends(require_check)]


# How many items a list skips: bounded, so the database never meets an offset beyond 64 bits.
Offset = Annotated[int, Query(ge=0, le=MAX_OFFSET, description="items to skip")]


def page_params(
    settings: SettingsDep,
    limit: Annotated[int | None, Query(ge=1, description="items per page")] = None,
    offset: Offset = 0,
) -> PageParams:
    if limit is not None and limit > settings.page_max:
        raise InvalidDocument.at(["query", "limit"],
                                 f"at most {settings.page_max} items per page")
    return PageParams(limit=limit or min(settings.page_default, settings.page_max), offset=offset)


Pagination = Annotated[PageParams, Depends(page_params)]


@dataclass(frozen=True)
class DivergencePages:
    pairs: Literal["baseline", "all"]
    pairs_limit: int | None  # None: every pair of the mode
    pairs_offset: int
    pairs_origin: bool
    members_limit: int
    members_offset: int


def divergence_pages(
    settings: SettingsDep,
    pairs: Annotated[Literal["baseline", "all"], Query(
        description="baseline: each group against the baseline (group 1, the usual "
                    "answer); all: the full matrix of pairs, a page at a time")] = "baseline",
    pairs_limit: Annotated[int | None, Query(
        ge=1, description="pairs per page (default: every baseline pair; a page of "
                          "page_default pairs of the full matrix)")] = None,
    pairs_offset: Annotated[int, Query(ge=0, le=MAX_OFFSET,
                                       description="pairs to skip")] = 0,
    pairs_origin: Annotated[bool, Query(
        description="with pairs=all: origin ops for every pair of the page (without: only "
                    "for the pairs with the baseline)")] = False,
    members_limit: Annotated[int | None, Query(
        ge=0, description="members listed per group (nodes, devices, env_keys), and of "
                          "members_without_tensor and excluded; the counts are complete "
                          "(default page_default)")] = None,
    members_offset: Annotated[int, Query(
        ge=0, le=MAX_OFFSET, description="members each of those lists skips (by node "
                                         "name): a page deeper into the groups")] = 0,
) -> DivergencePages:
    """/divergence's pages: the pairs shown and the members each group lists, each bounded
    by ``page_max`` (422 naming the parameter beyond it), so the answer's size follows
    the pages, not the fleet."""
    for name, value in (("pairs_limit", pairs_limit), ("members_limit", members_limit)):
        if value is not None and value > settings.page_max:
            raise InvalidDocument.at(["query", name], f"at most {settings.page_max}")
    default = min(settings.page_default, settings.page_max)
    if pairs == "all" and pairs_limit is None:
        pairs_limit = default
    return DivergencePages(pairs=pairs, pairs_limit=pairs_limit, pairs_offset=pairs_offset,
                           pairs_origin=pairs_origin,
                           members_limit=default if members_limit is None else members_limit,
                           members_offset=members_offset)


DivergencePagesDep = Annotated[DivergencePages, Depends(divergence_pages)]


async def reject_nul(request: Request) -> None:
    """No path or query value may hold a NUL character (``%00``), on every route (the app
    installs this for all of them).

    PostgreSQL's text cannot hold NUL: a query comparing with such a value fails inside
    the driver (a 500 before this check). No stored name can hold one, so in the path it
    names nothing (404); in the query it is a wrong value (422 naming the parameter).
    """
    # async: it runs on the event loop, for /healthz too, never waiting for a thread.
    for name, value in request.path_params.items():
        if isinstance(value, str) and "\x00" in value:
            raise NotFound(f"path parameter {name} {value!r} names nothing: no name "
                           "contains a NUL character (%00)")
    for name, value in request.query_params.multi_items():
        if "\x00" in name or "\x00" in value:
            raise InvalidDocument.at(["query", name.replace("\x00", "%00")],
                                     "must not contain a NUL character (%00)")


async def meter_ingest() -> AsyncIterator[IngestMeter]:
    """Times one upload and counts its answer (``numparity_runs_ingested``).

    A dependency with ``yield`` rather than a block in the route: declared before the
    route's other dependencies, it also sees what they raise (a missing or wrong agent
    token), which the agent treats like any other refusal (a 4xx: the run is moved aside).
    Its exit runs as the answer goes out (FastAPI's request scope), so a scrape may see
    an upload a moment after its client got the answer.
    """
    meter = IngestMeter()
    try:
        yield meter
    except BaseException as exc:
        # DomainError and HTTPException carry their status; anything else is a 5xx.
        meter.failed(getattr(exc, "status_code", 500))
        raise
    finally:
        meter.record()


MeteredIngest = Annotated[IngestMeter, Depends(meter_ingest)]
