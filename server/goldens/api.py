"""Routes of the pinned answers (design §3.11) and of `numparity-agent check` (§2.12)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, TypeVar

from fastapi import APIRouter, Path, Query, Request, Response, status
from pydantic import StringConstraints

from numparity_server.auth.schemas import Principal
from numparity_server.deps import AdminAuth, CheckAuth, DbSession, Pagination, ReaderAuth
from numparity_server.goldens import check as plans
from numparity_server.goldens import service
from numparity_server.goldens.repository import check_version
from numparity_server.goldens.schemas import CheckPlan, GoldenOut, GoldenPage, PinIn, UnpinIn
from numparity_server.kit.budget import MIN_REQUEST_COST
from numparity_server.kit.limits import charge_computation

router = APIRouter(prefix="/api/v1", tags=["goldens"])
T = TypeVar("T")
# What a `check` plan the server computes for a token costs it (kit.budget's unit, bytes):
# a request's least cost, so a token's burst pays a few hundred plans, then its rate.
PLAN_COST = MIN_REQUEST_COST

Filter = Annotated[str | None, Query(min_length=1, max_length=320)]
Attribute = Annotated[str | None, Query(max_length=255, description=(
    "The node's environment attribute, used when the server does not know its env_key "
    "(a pin of a stack may still hold it)"))]
# A node lists at most this many device models (an 8-GPU node of one model lists one).
MAX_MODELS = 16
Name = Annotated[str, StringConstraints(min_length=1, max_length=320)]
# A pin version's id (a 32-bit integer column).
GoldenId = Annotated[int, Path(ge=1, le=2**31 - 1, description="a pin version's id")]


def _who(principal: Principal) -> str:
    return f"token {principal.token_id}" + (f" ({principal.label})" if principal.label else "")


@router.post("/goldens", response_model=GoldenOut, status_code=status.HTTP_201_CREATED,
             responses={409: {"description": "The same pin changed at the same moment"}})
def post_golden(body: PinIn, session: DbSession, principal: AdminAuth) -> GoldenOut:
    """Pin a device model's answers on an environment or a software stack, from the
    fleet's current majority or from one run: a new version of that pin, with who (the
    admin token), when and why (admin)."""
    return service.pin(session=session, request=body, pinned_by=_who(principal))


@router.post("/goldens/{golden_id}/unpin", response_model=GoldenOut,
             status_code=status.HTTP_201_CREATED,
             responses={409: {"description": "Already unpinned"}})
def unpin_golden(golden_id: GoldenId, body: UnpinIn, session: DbSession,
                 principal: AdminAuth) -> GoldenOut:
    """Unpin: a new version of the pin that holds no answers (admin)."""
    return service.unpin(session=session, golden_id=golden_id, reason=body.reason,
                         pinned_by=_who(principal))


@router.get("/goldens", response_model=GoldenPage)
def list_goldens(session: DbSession, _principal: ReaderAuth, page: Pagination,
                 suite: Filter = None, model: Filter = None,
                 in_force: Annotated[bool, Query(description="only the versions in force")]
                 = False) -> GoldenPage:
    """Every version of every pin, newest first: what is pinned, by whom, when and why."""
    return service.list_pins(session=session, suite=suite, model=model, in_force=in_force,
                             limit=page.limit, offset=page.offset)


@router.get("/goldens/{golden_id}", response_model=GoldenOut)
def get_golden(golden_id: GoldenId, session: DbSession, _principal: ReaderAuth) -> GoldenOut:
    """One version of a pin with its answers."""
    return service.get_pin(session=session, golden_id=golden_id)


@router.get("/agent/check", response_model=CheckPlan)
def check(
    request: Request, session: DbSession, _principal: CheckAuth,
    env_key: Annotated[str, Query(min_length=1, max_length=64,
                                  description="The node's environment")],
    model: Annotated[list[Name], Query(min_length=1, max_length=MAX_MODELS, description=(
        "The node's device models (`cpu`, `cuda/NAME/CC`), repeated"))],
    suite: Annotated[str, Query(min_length=1, max_length=64)] = "standard",
    workload: Annotated[list[Name] | None, Query(max_length=64, description=(
        "Only these workloads (default: the server chooses)"))] = None,
    variant: Annotated[list[Name] | None, Query(max_length=16, description=(
        "Only these variants (default: the server chooses)"))] = None,
    budget_s: Annotated[float, Query(gt=0, le=86_400, description=(
        "Seconds a device may spend computing"))] = 40.0,
    child_s: Annotated[float, Query(ge=0, le=3_600, description=(
        "Seconds a variant's child process costs before it computes"))] = 4.0,
    torch: Attribute = None, cuda: Attribute = None, cudnn: Attribute = None,
    driver: Attribute = None, gpu_name: Attribute = None, compute_capability: Attribute = None,
    cpu_model: Attribute = None, cpu_capability: Attribute = None,
) -> Response:
    """What `numparity-agent check` runs on each of the node's devices and the answers it
    compares them with: the pin in force for the device model on this environment, else
    the fleet's majority there (check token: reads this and writes nothing; an agent's
    token may ask too). Kept per question (one computation for a cluster starting
    its jobs at once; `Age`: seconds since it was computed)."""
    promoted = {"torch": torch, "cuda": cuda, "cudnn": cudnn, "driver": driver,
                "gpu_name": gpu_name, "compute_capability": compute_capability,
                "cpu_model": cpu_model, "cpu_capability": cpu_capability}
    question = plans.CheckQuestion(
        suite=suite, env_key=env_key, models=tuple(dict.fromkeys(model)),
        promoted=tuple(sorted(promoted.items())),
        workloads=tuple(sorted(set(workload or ()))), variants=tuple(sorted(set(variant or ()))))
    pins, runs = check_version(session)
    # The connection goes back to the pool before the cache is read (or waited on): a
    # thousand checks at once then hold a connection for two short statements each.
    session.rollback()
    cache = request.app.state.check_cache

    paid = False

    def computed(compute: Callable[[], T]) -> Callable[[], T]:
        """What the asker computes, paid first from its token's byte budget (kit.limits:
        PLAN_COST a request that computes): a token asking new questions is held to its
        budget, one asking what is kept pays nothing."""
        def pay_then_compute() -> T:
            nonlocal paid
            if not paid:
                charge_computation(request.scope, PLAN_COST)
                paid = True
            return compute()
        return pay_then_compute

    # The ranking is kept per question and pin version, whatever the budget; the plan
    # sent per ranking and choice (the budget picks among the ranked answers, so its
    # values are as many plans as they make choices, each reading its own manifests).
    ranked = cache.get((question, pins), (runs,), computed(lambda: plans.check_ranking(
        session=session, question=question)))
    ranking: plans.Ranking = ranked.value
    chosen = ranking.chosen(budget_s=float(budget_s), child_s=float(child_s))
    cached = cache.get(("plan", question, pins, chosen), (runs,), computed(
        lambda: plans.check_plan(session=session, ranking=ranking, chosen=chosen)
        .model_dump_json().encode()))
    # Kept as the JSON it goes out as: a kept answer costs no serialisation either.
    return Response(cached.value, media_type="application/json",
                    headers={"Age": str(int(max(cached.age_s, ranked.age_s)))})
