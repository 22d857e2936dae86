"""GET /api/v1/audit."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query
from fastapi.responses import PlainTextResponse

from numparity_server.audit import export, service
from numparity_server.audit.schemas import AuditOut
from numparity_server.deps import DbSession, KeptReads, Pagination, PolicyDep, ReaderAuth

router = APIRouter(prefix="/api/v1", tags=["analysis"])

_CSV_EXAMPLE = ("node,finding,detail\r\n"
                "gpu-node-17,suspect (drill),\"gpu-node-17 / cuda:3 (NVIDIA A100-SXM4-80GB, "
                "UUID GPU-8f3c…, serial 1324…) disagrees with 7 identical peers in 2 runs "
                "(strict answers; 7 of the 7 peers agree)\"\r\n")
_CSV_DOC = {"content": {"text/csv": {"example": _CSV_EXAMPLE}},
            "description": "With format=csv: one table (findings unless table= names another)."}


@router.get("/audit", response_model=AuditOut, responses={
    200: _CSV_DOC, 400: {"description": "format=csv with an unknown `table`"}})
def get_audit(
    session: DbSession,
    policy: PolicyDep,
    _principal: ReaderAuth,
    kept: KeptReads,
    page: Pagination,
    format: Literal["json", "csv"] = "json",  # noqa: A002 - the query parameter's name
    table: Annotated[str, Query(description="CSV table (format=csv)",
                                json_schema_extra={"enum": list(export.TABLES)})]
    = "findings",
) -> AuditOut | PlainTextResponse:
    """The lab audit: inventory by GPU, driver, CUDA, cuDNN, torch and CPU capability;
    stale nodes; policy violations; suspect hardware (strict answers that differ from
    same-environment peers; drills marked); nondeterministic nodes; results whose input or
    parameter bytes differ from the fleet's; environment changes and the results that
    changed with them (drift); the cost of determinism per environment. The summary
    counts every node; the lists of nodes (stale, policy, suspects, nondeterministic,
    broken_inputs, drift) hold a page each (`limit` rows from `offset`), `totals` their
    lengths; CSV has every row. Kept until the fleet changes (`Age`: seconds since it was
    computed)."""
    export.check_table(table)  # whatever the format: the schema lists the tables
    if format == "csv":
        report = kept(("audit", "all"), lambda: service.audit(session=session,
                                                              policy=policy))
        return PlainTextResponse(export.to_csv(report, table), media_type="text/csv",
                                 headers=kept.headers)
    return kept(("audit", page.limit, page.offset), lambda: service.audit(
        session=session, policy=policy, limit=page.limit, offset=page.offset))
