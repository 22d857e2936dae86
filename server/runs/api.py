"""Routes of the ingest path: POST /runs, POST /fingerprints/missing, GET /runs/{run_id}."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from fastapi import APIRouter, Request, Response, status
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from numparity_server.auth.schemas import Principal
from numparity_server.auth.service import require_node
from numparity_server.deps import (
    AgentAuth,
    DbSession,
    MeteredIngest,
    Pagination,
    ReaderAuth,
    SettingsDep,
)
from numparity_server.kit.body import decode_body, parse_json_object
from numparity_server.kit.ingest_meter import IngestMeter
from numparity_server.kit.limits import charge_decoded
from numparity_server.kit.pagination import Page
from numparity_server.kit.settings import Settings
from numparity_server.runs import service
from numparity_server.runs.schemas import (
    MissingIn,
    MissingOut,
    RunCreated,
    RunDocument,
    RunListItem,
    RunSummary,
)

router = APIRouter(prefix="/api/v1", tags=["runs"])

# The body is read by hand (size limit, gzip); this documents it in OpenAPI all the same.
_RUN_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/RunDocument"}}},
        "description": "A run document (numparity.run/v1); may be sent with "
                       "Content-Encoding: gzip.",
    }
}


async def _document_reader(request: Request, settings: Settings) -> Callable[[], dict[str, Any]]:
    """The request's JSON document, to be read on a worker thread: the body is already in
    (kit.limits), and gunzipping and parsing it may take a while."""
    body = await request.body()
    encoding = request.headers.get("content-encoding")
    return lambda: parse_json_object(decode_body(body, encoding=encoding,
                                                 limit=settings.max_body_bytes,
                                                 charge=partial(charge_decoded, request.scope)))


@router.post(
    "/runs",
    response_model=RunCreated,
    status_code=status.HTTP_201_CREATED,
    openapi_extra=_RUN_BODY,
    # Error bodies and the statuses every route shares: numparity_server.openapi.
    responses={200: {"model": RunCreated, "description": "The same document was already stored"},
               400: {"description": "An unsupported `schema` version, or corrupt gzip"},
               409: {"description": "Another document is stored under this `run_id`"}},
)
async def upload_run(
    request: Request, response: Response, ingest: MeteredIngest, session: DbSession,
    settings: SettingsDep, principal: AgentAuth,
) -> RunCreated:
    """Store a run document (design §3.2): 201 new, 200 the same document again."""
    # ``ingest`` comes first: it times and counts the refusals of the token checks too.
    read_document = await _document_reader(request, settings)
    return await ingest_document(read_document, response=response, ingest=ingest,
                                 session=session, settings=settings, principal=principal)


async def ingest_document(read_document: Callable[[], dict[str, Any]], *, response: Response,
                          ingest: IngestMeter, session: Session, settings: Settings,
                          principal: Principal) -> RunCreated:
    """Read and store a run document: 201 new, 200 the same document again. Decoding,
    parsing, validating and storing run on a worker thread, so the event loop goes on
    serving other requests."""

    def ingest_body() -> service.Ingested:
        document = read_document()
        require_node(principal, service.node_name(document))  # a bound token: its nodes only
        return service.ingest_run(session=session, document=document,
                                  max_clock_skew_s=settings.max_clock_skew_s)

    outcome = await run_in_threadpool(ingest_body)
    ingest.stored(created=outcome.created)
    if not outcome.created:
        response.status_code = status.HTTP_200_OK
    return outcome.run


_MISSING_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/MissingIn"}}},
    }
}


@router.post("/fingerprints/missing", response_model=MissingOut, openapi_extra=_MISSING_BODY)
async def missing_fingerprints(request: Request, session: DbSession, settings: SettingsDep,
                               _principal: AgentAuth) -> MissingOut:
    """Which of these tensor hashes, manifest hashes and trace hashes the server lacks
    (design §3.2), which of the large tensors in `values` it wants the full values of,
    and the largest request body it takes."""
    read_document = await _document_reader(request, settings)

    def answer() -> MissingOut:
        question = service.validate_missing(read_document())
        return service.missing_fingerprints(session=session, hashes=question.hashes,
                                            manifests=question.manifests,
                                            values=question.values,
                                            trace_hashes=question.traces,
                                            max_body_bytes=settings.max_body_bytes)

    return await run_in_threadpool(answer)


@router.get("/runs", response_model=Page[RunListItem])
def list_runs(
    session: DbSession, _principal: ReaderAuth, page: Pagination, node: str | None = None
) -> Page[RunListItem]:
    """Runs, newest first (optionally of one node)."""
    return service.list_runs(session=session, node=node, limit=page.limit, offset=page.offset)


@router.get("/runs/{run_id}", response_model=RunSummary)
def get_run(run_id: str, session: DbSession, _principal: ReaderAuth) -> RunSummary:
    """One run: its node, environment, times and results."""
    return service.run_summary(session=session, run_id=run_id)


OPENAPI_MODELS = (RunDocument, MissingIn)
