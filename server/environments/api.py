"""GET /api/v1/environments."""

from __future__ import annotations

from fastapi import APIRouter

from numparity_server.deps import DbSession, Pagination, ReaderAuth
from numparity_server.environments import service
from numparity_server.environments.schemas import EnvironmentItem
from numparity_server.kit.pagination import Page

router = APIRouter(prefix="/api/v1", tags=["fleet"])


@router.get("/environments", response_model=Page[EnvironmentItem])
def list_environments(
    session: DbSession, _principal: ReaderAuth, page: Pagination,
    gpu_name: str | None = None, driver: str | None = None, cuda: str | None = None,
    cudnn: str | None = None, torch: str | None = None, cpu_capability: str | None = None,
) -> Page[EnvironmentItem]:
    """Every env_key stored, oldest first: the promoted attributes (GPU, driver, CUDA,
    cuDNN, torch, CPU), how many nodes ran on it, how many are on it now, how many runs."""
    filters = {"gpu_name": gpu_name, "driver": driver, "cuda": cuda, "cudnn": cudnn,
               "torch": torch, "cpu_capability": cpu_capability}
    return service.list_environments(session=session, filters=filters, limit=page.limit,
                                     offset=page.offset)
