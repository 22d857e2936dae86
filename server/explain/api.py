"""Routes of explain (design §2.11): GET /agent/reference/{run_id}, POST and GET
/explanations."""

from __future__ import annotations

from functools import partial
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request, status
from starlette.concurrency import run_in_threadpool

from numparity_server.auth.service import require_node
from numparity_server.deps import AgentAuth, DbSession, Pagination, ReaderAuth, SettingsDep
from numparity_server.explain import service
from numparity_server.explain.schemas import (
    ExplanationDocument,
    ExplanationOut,
    ExplanationsStored,
    ReferenceOut,
)
from numparity_server.kit.body import decode_body, parse_json_object
from numparity_server.kit.limits import charge_decoded
from numparity_server.kit.pagination import Page

router = APIRouter(prefix="/api/v1", tags=["explain"])

Filter = Annotated[str | None, Query(min_length=1)]

# The body is read by hand (gzip, bounded JSON, off the event loop: kit.body), as the
# run document's; this documents it in OpenAPI all the same.
_FINDINGS_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {
            "schema": {"$ref": "#/components/schemas/ExplanationDocument"}}},
        "description": "What `numparity-agent explain` found (numparity.explain/v1); may be "
                       "sent with Content-Encoding: gzip.",
    }
}


@router.get("/agent/reference/{run_id}", response_model=ReferenceOut)
def reference(
    run_id: str, session: DbSession, _principal: AgentAuth,
    workload: Filter = None, variant: Filter = None,
) -> ReferenceOut:
    """A run as `numparity-agent explain` reads it: its ok results' tensor names, kinds and
    hashes, input and parameter hashes, and the run's numeric environment; nothing else of
    the run or its node. Any agent token may read any run."""
    return service.reference(session=session, run_id=run_id, workload=workload,
                             variant=variant)


@router.post(
    "/explanations",
    response_model=ExplanationsStored,
    status_code=status.HTTP_201_CREATED,
    openapi_extra=_FINDINGS_BODY,
    responses={400: {"description": "An unsupported `schema` version, or corrupt gzip"}},
)
async def post_explanations(request: Request, session: DbSession, settings: SettingsDep,
                            principal: AgentAuth) -> ExplanationsStored:
    """Store what `numparity-agent explain` found, a row per finding. A token bound to
    nodes posts only for its nodes; `against` must be a stored run and `node` a node that
    has uploaded a run."""
    body = await request.body()
    encoding = request.headers.get("content-encoding")

    def store() -> ExplanationsStored:
        document = parse_json_object(decode_body(body, encoding=encoding,
                                                 limit=settings.max_body_bytes,
                                                 charge=partial(charge_decoded, request.scope)))
        require_node(principal, service.node_name(document), what="explanations")
        return service.store_explanations(session=session, document=document)

    return await run_in_threadpool(store)


@router.get("/explanations", response_model=Page[ExplanationOut])
def list_explanations(
    session: DbSession, _principal: ReaderAuth, page: Pagination,
    node: Annotated[str | None, Query(min_length=1, description="the explaining node")] = None,
    against_node: Annotated[str | None, Query(
        min_length=1, description="the node of the reference run")] = None,
    workload: Filter = None, variant: Filter = None,
    target: Annotated[Literal["run", "eager"] | None, Query(
        description="run: findings against another run's bits; eager: compiled results "
                    "against their run's eager answer")] = None,
) -> Page[ExplanationOut]:
    """What `explain` found, newest first: per finding the setting under which `node` gives
    the bits of run `against_run`'s result (or, target eager, under which its compiled
    result gives that run's eager answer; or the closest one), and whether the node's
    environment has changed since (`stale`)."""
    return service.list_explanations(session=session, node=node, against_node=against_node,
                                     workload=workload, variant=variant, target=target,
                                     limit=page.limit, offset=page.offset)


OPENAPI_MODELS = (ExplanationDocument,)
