"""GET /api/v1 (the API's resources) and GET /api/v1/suites (what the fleet has run)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

import numparity_server
from numparity_server.catalog import service
from numparity_server.catalog.schemas import ApiRoot, Resource, SuitesPage
from numparity_server.deps import DbSession, Pagination, ReaderAuth

PREFIX = "/api/v1"
router = APIRouter(tags=["catalog"])


@router.get(PREFIX, response_model=ApiRoot)
def api_root(request: Request) -> ApiRoot:
    """The API's resources, each with its one-line summary; no token needed (it names
    routes, not data). Start at /api/v1/suites: what the fleet has run."""
    # Read from the OpenAPI schema (as ``openapi.py`` does), not FastAPI's route objects,
    # whose layout changes between versions: the list is the documented one.
    resources = [
        Resource(method=method.upper(), path=path, summary=_summary(operation))
        for path, operations in request.app.openapi().get("paths", {}).items()
        if path.startswith(PREFIX + "/")
        for method, operation in operations.items()
    ]
    resources.sort(key=lambda r: (r.path != PREFIX + "/suites", r.path, r.method))
    return ApiRoot(name="numparity", version=getattr(numparity_server, "__version__", "0.1.0"),
                   resources=resources, docs="/docs", redoc="/redoc",
                   openapi="/openapi.json", dashboard="/")


@router.get(PREFIX + "/suites", response_model=SuitesPage, responses={
    404: {"description": "No node has results in `suite`"}})
def list_suites(
    session: DbSession, _principal: ReaderAuth, page: Pagination,
    suite: Annotated[str | None, Query(min_length=1, description="Only this suite")] = None,
) -> SuitesPage:
    """What the fleet has run, as the server has seen it in every node's newest results:
    each suite's workloads (by suite, then name; paginated) with their versions, variants
    (nodes by status, devices, a /divergence link) and tensor names with their kinds —
    the values /divergence's `workload`, `variant` and `tensor` take."""
    return service.suites(session=session, suite=suite, limit=page.limit, offset=page.offset)


def _summary(operation: dict[str, Any]) -> str:
    """The operation's description up to its first full stop (or its summary)."""
    text = " ".join(str(operation.get("description") or operation.get("summary", "")).split())
    head, stop, _rest = text.partition(". ")
    return head + "." if stop else text
