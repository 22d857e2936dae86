"""GET /metrics: Prometheus's text format (not under /api/v1, design §3.2)."""

from __future__ import annotations

import threading

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST

from numparity_server.deps import DbSession, PolicyDep, ReaderAuth, SettingsDep
from numparity_server.metrics import service
from numparity_server.metrics.service import FleetCache

router = APIRouter(tags=["metrics"])

_cache_lock = threading.Lock()


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {}},
                     "description": "The metrics in Prometheus's text format"}},
)
def metrics(request: Request, session: DbSession, settings: SettingsDep, policy: PolicyDep,
            _principal: ReaderAuth) -> Response:
    """Uploads by outcome and their latency (summed over the server's processes), nodes
    by audit status, groups per workload and variant, the age of each node's newest run.
    The fleet figures are read from the database at most every
    ``NUMPARITY_METRICS_CACHE_SECONDS``."""
    snapshot = _fleet_cache(request, settings.metrics_cache_seconds).get(
        lambda: service.fleet_snapshot(session=session, policy=policy))
    return Response(service.exposition(snapshot), media_type=CONTENT_TYPE_LATEST)


def _fleet_cache(request: Request, seconds: float) -> FleetCache:
    """The app's cache, made by its first scrape."""
    state = request.app.state
    with _cache_lock:
        cache: FleetCache | None = getattr(state, "fleet_metrics", None)
        if cache is None:
            cache = state.fleet_metrics = FleetCache(seconds)
        return cache
