"""GET /api/v1/compare."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from numparity_server.compare import service
from numparity_server.compare.schemas import COMPARE_EXAMPLE, CompareOut
from numparity_server.deps import DbSession, Pagination, PolicyDep, ReadBudget, ReaderAuth

router = APIRouter(prefix="/api/v1", tags=["analysis"])

_ERROR: dict[str, Any] = {
    "content": {"application/json": {"example": {"error": "not_found",
                                                 "detail": "no run with run_id 'r-17'"}}}}


@router.get(
    "/compare",
    response_model=CompareOut,
    responses={200: {"content": {"application/json": {"example": COMPARE_EXAMPLE}}},
               401: _ERROR, 403: _ERROR, 404: _ERROR},
)
def compare_runs(
    session: DbSession,
    policy: PolicyDep,
    _principal: ReaderAuth,
    page: Pagination,
    budget: ReadBudget,
    run_a: Annotated[str, Query(min_length=1, description="The reference run (expected)")],
    run_b: Annotated[str, Query(min_length=1, description="The candidate run")],
    workload: Annotated[str | None, Query(min_length=1)] = None,
    variant: Annotated[str | None, Query(min_length=1)] = None,
    device_a: Annotated[str | None, Query(
        min_length=1, max_length=64,
        description="Only run a's results on this device (cuda:3); matched with run b's "
                    "on device_b")] = None,
    device_b: Annotated[str | None, Query(
        min_length=1, max_length=64,
        description="Only run b's results on this device")] = None,
) -> CompareOut:
    """Per-tensor comparison of run b against run a, result by result (matched by suite,
    workload, variant and device; with device_a and device_b, two devices of one run or
    of two runs): verdicts and metrics under the lab's tolerance policy, the first
    divergent layer, the largest jump, the first NaN or Inf, and the environment
    attributes that differ. Every pair has its summary over all its tensors; the tensor
    rows are listed `limit` at a time from `offset`, counted over the pairs in order."""
    return service.compare_runs(session=session, policy=policy, run_a=run_a, run_b=run_b,
                                workload=workload, variant=variant, device_a=device_a,
                                device_b=device_b, limit=page.limit, offset=page.offset,
                                budget=budget)
