"""GET /api/v1/nodes and GET /api/v1/nodes/{name} (the node's timeline)."""

from __future__ import annotations

from fastapi import APIRouter

from numparity_server.deps import DbSession, Pagination, ReaderAuth
from numparity_server.kit.pagination import Page
from numparity_server.nodes import service
from numparity_server.nodes.schemas import NodeItem, NodeTimeline

router = APIRouter(prefix="/api/v1", tags=["fleet"])


@router.get("/nodes", response_model=Page[NodeItem])
def list_nodes(session: DbSession, _principal: ReaderAuth, page: Pagination) -> Page[NodeItem]:
    """Nodes by name: labels, newest run, its env_key, and how many runs are stored."""
    return service.list_nodes(session=session, limit=page.limit, offset=page.offset)


@router.get("/nodes/{name}", response_model=NodeTimeline,
            responses={404: {"description": "No such node"}})
def node_timeline(name: str, session: DbSession, _principal: ReaderAuth,
                  page: Pagination) -> NodeTimeline:
    """The node's runs, newest first (paginated): for each, whether the environment changed
    from the run before and which results' manifests changed."""
    return service.node_timeline(session=session, name=name, limit=page.limit,
                                 offset=page.offset)
