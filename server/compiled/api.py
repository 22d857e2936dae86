"""GET /api/v1/runs/{run_id}/compiled."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from numparity_server.compiled import service
from numparity_server.compiled.schemas import CompiledOut
from numparity_server.deps import DbSession, PolicyDep, ReadBudget, ReaderAuth

router = APIRouter(prefix="/api/v1", tags=["analysis"])

_ERROR: dict[str, Any] = {
    "content": {"application/json": {"example": {"error": "not_found",
                                                 "detail": "no run with run_id 'r-17'"}}}}


@router.get("/runs/{run_id}/compiled", response_model=CompiledOut,
            responses={401: _ERROR, 403: _ERROR, 404: _ERROR})
def compiled_against_eager(run_id: str, session: DbSession, policy: PolicyDep,
                           _principal: ReaderAuth, budget: ReadBudget) -> CompiledOut:
    """Each compiled result of the run (variant `compiled`: torch.compile, Inductor)
    against the same run's eager answer (`default`) on the same device: the verdict under
    the policy's tolerances, max abs/rel/ULP, the first recorded layer where they part,
    and which of the two is closer to the float64 answer (the fp64 judge's RMSE)."""
    return service.compiled_against_eager(session=session, policy=policy, run_id=run_id,
                                          budget=budget)
