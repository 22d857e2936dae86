"""GET /api/v1/divergence."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from numparity_server.deps import (
    DbSession,
    DivergencePagesDep,
    KeptReads,
    PolicyDep,
    ReadBudget,
    ReaderAuth,
)
from numparity_server.divergence import service
from numparity_server.divergence.schemas import DivergenceOut

router = APIRouter(prefix="/api/v1", tags=["analysis"])


@router.get("/divergence", response_model=DivergenceOut, responses={
    404: {"description": "No result of this key, or none with `tensor`"}})
def get_divergence(
    session: DbSession,
    policy: PolicyDep,
    _principal: ReaderAuth,
    pages: DivergencePagesDep,
    kept: KeptReads,
    budget: ReadBudget,
    workload: Annotated[str, Query(min_length=1)],
    variant: Annotated[str, Query(min_length=1)],
    tensor: Annotated[str | None, Query(
        min_length=1, description="Group by this tensor's bits; without it, by the whole "
                                  "result, each pair judged by its result verdict")] = None,
    suite: str = "standard",
    workload_version: int | None = None,
) -> DivergenceOut:
    """Groups of the fleet's latest results of one key, each group compared with the
    baseline (the usual answer; the full matrix of pairs a page at a time with
    `pairs=all`), the fp64 verdicts (with a tensor) and the environment attributes that
    explain the split. A comparison of two answers is computed once and kept, and the
    whole answer until the fleet changes (`Age`: seconds since it was computed). 404
    naming the tensors there are when no result has `tensor`."""
    return kept(
        ("divergence", suite, workload, variant, tensor, workload_version, pages),
        lambda: service.divergence(
            session=session, suite=suite, workload=workload, variant=variant, tensor=tensor,
            workload_version=workload_version, policy=policy, pairs=pages.pairs,
            pairs_limit=pages.pairs_limit, pairs_offset=pages.pairs_offset,
            pairs_origin=pages.pairs_origin, members_limit=pages.members_limit,
            members_offset=pages.members_offset, budget=budget),
        keep=lambda answer: not answer.pending)
