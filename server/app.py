"""The FastAPI application."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio.to_thread
from fastapi import Depends, FastAPI
from starlette.concurrency import run_in_threadpool

import numparity_server
from numparity_server import openapi
from numparity_server.audit.api import router as audit_router
from numparity_server.catalog.api import router as catalog_router
from numparity_server.compare.api import router as compare_router
from numparity_server.compiled.api import router as compiled_router
from numparity_server.dashboard import api as dashboard
from numparity_server.dashboard.api_docs import install_api_docs
from numparity_server.deps import reject_nul
from numparity_server.divergence.api import router as divergence_router
from numparity_server.environments.api import router as environments_router
from numparity_server.explain.api import OPENAPI_MODELS as EXPLAIN_MODELS
from numparity_server.explain.api import router as explain_router
from numparity_server.goldens.api import router as goldens_router
from numparity_server.health.api import router as health_router
from numparity_server.kit import migrate
from numparity_server.kit.compute import Computations
from numparity_server.kit.db import get_engine, session_factory
from numparity_server.kit.handlers import install_error_handlers
from numparity_server.kit.limits import BodyLimits
from numparity_server.kit.orphan import stop_when_orphaned
from numparity_server.kit.policy_file import load_policy
from numparity_server.kit.readcache import ReadCache
from numparity_server.kit.security_headers import SecurityHeaders
from numparity_server.kit.settings import Settings
from numparity_server.metrics.api import router as metrics_router
from numparity_server.nodes.api import router as nodes_router
from numparity_server.runs.api import OPENAPI_MODELS
from numparity_server.runs.api import router as runs_router
from numparity_server.uploads.api import router as uploads_router


def create_app(settings: Settings) -> FastAPI:
    """The application, configured by ``settings`` and nothing else."""

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        anyio.to_thread.current_default_thread_limiter().total_tokens = (
            settings.worker_threads)
        if settings.migrate_on_start:
            await run_in_threadpool(migrate.upgrade, settings.database_url)
        yield
        # Stopping: no read starts another computation (kit.compute).
        app.state.computations.stop()

    app = FastAPI(
        title="numparity",
        version=getattr(numparity_server, "__version__", "0.1.0"),
        description="Do your machines compute the same numbers? Runs, divergence, audit.",
        lifespan=lifespan,
        dependencies=[Depends(reject_nul)],
        # /docs and /redoc are served from the package's own Swagger UI and ReDoc
        # (install_api_docs), not FastAPI's CDN pages; no OAuth, so no redirect page.
        docs_url=None,
        redoc_url=None,
        swagger_ui_oauth2_redirect_url=None,
    )
    app.add_middleware(SecurityHeaders)
    app.state.settings = settings
    app.state.engine = get_engine(settings)
    app.state.session_factory = session_factory(app.state.engine)
    app.state.policy = load_policy(settings.policy_file)
    app.state.read_cache = ReadCache(fresh_s=settings.read_cache_seconds,
                                     max_age_s=settings.read_cache_max_age_s)
    app.state.check_cache = ReadCache(fresh_s=settings.check_cache_seconds,
                                      max_age_s=max(settings.check_cache_seconds,
                                                    settings.read_cache_max_age_s),
                                      max_entries=1024)
    app.state.computations = Computations(slots=settings.compute_slots,
                                          seconds=settings.compute_seconds)
    install_error_handlers(app, pages=(dashboard.is_page, dashboard.error_page))
    app.include_router(health_router)
    app.include_router(catalog_router)
    app.include_router(runs_router)
    app.include_router(uploads_router)
    app.include_router(nodes_router)
    app.include_router(environments_router)
    app.include_router(divergence_router)
    app.include_router(compare_router)
    app.include_router(compiled_router)
    app.include_router(audit_router)
    app.include_router(explain_router)
    app.include_router(goldens_router)
    app.include_router(metrics_router)
    dashboard.install(app)
    install_api_docs(app)
    openapi.install(app, models=(*OPENAPI_MODELS, *EXPLAIN_MODELS))
    # Outside the routes and their dependencies: no database work before the body is in.
    app.add_middleware(BodyLimits, max_body_bytes=settings.max_body_bytes,
                       body_timeout_s=settings.body_timeout_s,
                       token_bytes_per_s=settings.token_bytes_per_s,
                       max_document_bytes=settings.max_document_bytes)
    return app


def create_app_from_environment() -> FastAPI:
    """uvicorn's factory for ``serve --workers N``: each worker process reads the settings
    the parent exported (``kit.settings.worker_environment``)."""
    return create_app(Settings())


def create_worker_app() -> FastAPI:
    """``create_app_from_environment`` for a worker of ``serve --workers N``, which stops
    once the ``serve`` process that started it is gone (``kit.orphan``)."""
    stop_when_orphaned()
    return create_app_from_environment()
