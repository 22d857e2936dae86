"""Routes of the uploads in parts: PUT a part of a document or of a tensor's values, POST
a complete document as a run (design §3.2, "uploads in parts")."""

from __future__ import annotations

from functools import partial
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request, Response, status
from starlette.concurrency import run_in_threadpool

from numparity_server.deps import AgentAuth, DbSession, MeteredIngest, SettingsDep
from numparity_server.kit.body import decode_body, parse_json_object
from numparity_server.kit.errors import DomainError, UploadTooLarge
from numparity_server.kit.limits import charge_decoded
from numparity_server.kit.settings import Settings
from numparity_server.runs.api import ingest_document
from numparity_server.runs.schemas import SHA256_HEX, RunCreated
from numparity_server.uploads import service
from numparity_server.uploads.schemas import UploadState

router = APIRouter(prefix="/api/v1", tags=["runs"])

Digest = Annotated[str, Path(pattern=SHA256_HEX)]
INT64_MAX = 2**63 - 1  # offsets and totals are the database's BIGINT
Offset = Annotated[int, Query(ge=0, le=INT64_MAX,
                              description="Where the part begins in the whole upload")]

_PART_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {"application/octet-stream": {"schema": {"type": "string",
                                                             "format": "binary"}}},
        "description": "The part's bytes (at most NUMPARITY_MAX_BODY_BYTES); may be sent "
                       "with Content-Encoding: gzip.",
    }
}


def _limits(settings: Settings) -> service.Limits:
    return service.Limits(max_document_bytes=settings.max_document_bytes,
                          max_values_bytes=settings.max_values_bytes)


async def _part(request: Request, settings: Settings) -> bytes:
    body = await request.body()
    encoding = request.headers.get("content-encoding")
    return await run_in_threadpool(decode_body, body, encoding=encoding,
                                   limit=settings.max_body_bytes,
                                   charge=partial(charge_decoded, request.scope))


@router.put("/uploads/{sha256}", response_model=UploadState, openapi_extra=_PART_BODY,
            responses={409: {"description": "The part does not continue the bytes held: "
                                            "its Upload-Offset header says where to"},
                       413: {"description": "The body passes the limit (its "
                                            "Numparity-Max-Body-Bytes header), or the whole "
                                            "document passes NUMPARITY_MAX_DOCUMENT_BYTES"},
                       507: {"description": "The token holds too much unfinished"}})
async def put_document_part(sha256: Digest, offset: Offset,
                            total: Annotated[int, Query(gt=0, le=INT64_MAX,
                                                        description="The whole document's "
                                                                    "bytes")],
                            request: Request, session: DbSession, settings: SettingsDep,
                            principal: AgentAuth) -> UploadState:
    """A part of a run document too large for one body: bytes ``offset``.. of the gzip
    of its JSON, named by that gzip's sha256. A part repeating bytes the server holds
    changes nothing; the answer says how many it holds."""
    data = await _part(request, settings)
    return await run_in_threadpool(
        service.put_part, session=session, token_id=_token(principal.token_id),
        kind=service.DOCUMENT, digest=sha256, offset=offset, total=total, data=data,
        limits=_limits(settings))


@router.post("/uploads/{sha256}/run", response_model=RunCreated,
             status_code=status.HTTP_201_CREATED,
             responses={200: {"model": RunCreated,
                              "description": "The same document was already stored"},
                        409: {"description": "The upload is incomplete (Upload-Offset) or "
                                             "another document is stored under its run_id"}})
async def ingest_uploaded_run(sha256: Digest, request: Request, response: Response,
                              ingest: MeteredIngest, session: DbSession,
                              settings: SettingsDep, principal: AgentAuth) -> RunCreated:
    """Store the run document uploaded in parts under ``sha256``, as POST /runs stores
    one; its parts are then dropped."""
    token_id = _token(principal.token_id)
    whole = await run_in_threadpool(service.assembled_document, session=session,
                                    token_id=token_id, digest=sha256)

    def read_document() -> dict[str, Any]:
        # The gzip the agent sends (a JSON document never begins with gzip's magic).
        encoding = "gzip" if whole[:2] == b"\x1f\x8b" else None
        if encoding is None and len(whole) > settings.max_document_bytes:
            raise _document_too_large(settings.max_document_bytes)
        # The parts paid what they carried; the document pays what it decompresses to
        # (the budget counts decompressed bytes, kit.limits).
        return parse_json_object(decode_body(whole, encoding=encoding,
                                             limit=settings.max_document_bytes,
                                             too_large=_document_too_large,
                                             charge=partial(charge_decoded, request.scope)))

    try:
        created = await ingest_document(read_document, response=response, ingest=ingest,
                                        session=session, settings=settings,
                                        principal=principal)
    except DomainError as error:
        # This document will not become a run: its parts go. Not so for an answer that
        # asks the agent to come back (429 over its byte budget, 408): the retry stores
        # the same parts, which it paid for already.
        if error.status_code < 500 and error.status_code not in (408, 429):
            await run_in_threadpool(service.drop, session=session, token_id=token_id,
                                    kind=service.DOCUMENT, digest=sha256)
        raise
    await run_in_threadpool(service.drop, session=session, token_id=token_id,
                            kind=service.DOCUMENT, digest=sha256)
    return created


def _document_too_large(limit: int) -> UploadTooLarge:
    return UploadTooLarge(f"the document passes {limit} bytes once decoded (setting "
                          "NUMPARITY_MAX_DOCUMENT_BYTES)")


@router.put("/values/{hash}", response_model=UploadState, openapi_extra=_PART_BODY,
            responses={404: {"description": "No stored fingerprint has this hash"},
                       409: {"description": "The part does not continue the bytes held: "
                                            "its Upload-Offset header says where to"},
                       413: {"description": "The body passes the limit (its "
                                            "Numparity-Max-Body-Bytes header), or the values "
                                            "pass NUMPARITY_MAX_VALUES_BYTES"},
                       422: {"description": "The complete values are not the hash's bytes"},
                       507: {"description": "The token holds too much unfinished"}})
async def put_values_part(hash: Digest, offset: Offset, request: Request, session: DbSession,
                          settings: SettingsDep, principal: AgentAuth) -> UploadState:
    """A part of a large tensor's full values (little-endian bytes ``offset``..), sent
    after the run that holds the tensor when the server asked for them
    (``missing_values``). Once complete they are checked against the hash and kept."""
    data = await _part(request, settings)
    return await run_in_threadpool(
        service.put_values_part, session=session, token_id=_token(principal.token_id),
        digest=hash, offset=offset, data=data, limits=_limits(settings))


def _token(token_id: int | None) -> int:
    # Agent routes always have a token (writes always need one); 0 is no token's id.
    return token_id if token_id is not None else 0
