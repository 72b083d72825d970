"""The gateway application: lifespan-held state, one error handler set, one router per surface."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
from fastapi import FastAPI

from rlgw.db.engine import async_session_factory, make_async_engine
from rlgw.settings import Settings, get_settings

from .admin.backends import router as admin_backends_router
from .admin.keys import router as admin_keys_router
from .admin.models import router as admin_models_router
from .admin.register import router as register_router
from .admin.router import router as admin_router
from .admin.tenants import router as admin_tenants_router
from .anthropic.router import router as anthropic_router
from .auth import AuthService
from .body_limit import BodyLimitMiddleware
from .context import GatewayContext
from .dashboard.router import router as dashboard_router
from .errors import install_error_handlers
from .fast_lane import install_fast_lanes
from .health import router as health_router
from .limits import Limiter, ReleaseSlots
from .metrics.install import install_metrics
from .openai.router import router as openai_router
from .proxy.backend_events import follow_registry
from .proxy.backend_health import watch_backends
from .proxy.routing import BackendPool
from .proxy.service import ProxyService
from .proxy.upstream import AiohttpUpstream, HttpxUpstream, Upstream
from .recording.doubtful_journal import DoubtfulJournal, journal_directory
from .recording.recorder import Recorder
from .responses.router import router as responses_router
from .retention import enabled as retention_enabled
from .retention import sweep_periodically
from .sessions.router import router as sessions_router

log = logging.getLogger("rlgw.gateway")


def create_app(
    settings: Settings | None = None,
    *,
    upstream_transport: httpx.AsyncBaseTransport | None = None,
    fast_lanes: bool = True,
    children: Callable[[], dict[str, Any]] | None = None,
) -> FastAPI:
    """The gateway app. `upstream_transport` replaces the network to the backends (fault tests):
    generation then goes through an httpx client over it instead of the aiohttp one
    (gateway/proxy/upstream.py); it is not used by backend registration, which always checks and
    pins real addresses. `fast_lanes=False` leaves every generation request to its FastAPI route
    (gateway/fast_lane.py; the lanes' tests compare the two). `children`: the processes started
    beside this gateway (`rlgw up`'s trainer and vLLM) as /healthz reports them."""
    settings = settings or get_settings()
    if not settings.database_url:
        raise RuntimeError("RLGW_DATABASE_URL is not set (rlgw serve/up start one if needed)")

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = make_async_engine(
            settings.database_url, connect_timeout_s=settings.database_connect_timeout_s
        )
        db_sessions = async_session_factory(engine)
        timeout = httpx.Timeout(
            settings.upstream_timeout_s, connect=settings.upstream_connect_timeout_s
        )
        limits = httpx.Limits(max_connections=1000, max_keepalive_connections=200)
        async with httpx.AsyncClient(
            timeout=timeout, limits=limits, transport=upstream_transport
        ) as http:
            upstream: Upstream = (
                HttpxUpstream(http)
                if upstream_transport is not None
                else AiohttpUpstream(
                    timeout_s=settings.upstream_timeout_s,
                    connect_timeout_s=settings.upstream_connect_timeout_s,
                )
            )
            pool = BackendPool(db_sessions, hold_timeout_s=settings.backend_hold_s)
            await pool.refresh()
            recorder = Recorder(
                engine,
                queue_size=settings.record_queue_size,
                batch_size=settings.record_batch_size,
                retry_s=settings.record_retry_s,
                journal=DoubtfulJournal(journal_directory(settings.home, settings.database_url)),
            )
            recorder.on_recorded = app.state.metrics.completion_recorded
            recorder.start()
            app.state.context = GatewayContext(
                settings=settings,
                engine=engine,
                db_sessions=db_sessions,
                http=http,
                pool=pool,
                recorder=recorder,
                proxy=ProxyService(pool, recorder, upstream, db_sessions),
                auth=AuthService(settings, db_sessions),
                limiter=Limiter(
                    settings.rate_limit_rps,
                    settings.rate_limit_burst,
                    settings.max_concurrency_per_key,
                ),
            )
            if app.state.context.auth.enabled and app.state.context.auth.ephemeral_secret:
                log.warning(
                    "RLGW_TOKEN_SECRET is not set: session tokens are signed with a random "
                    "secret of this process and stop working when it restarts"
                )
            listening = asyncio.Event()
            refresher = asyncio.create_task(
                follow_registry(
                    pool,
                    settings.database_url,
                    poll_s=settings.backend_refresh_s,
                    ready=listening,
                    connect_timeout_s=settings.database_connect_timeout_s,
                )
            )
            await asyncio.wait_for(listening.wait(), timeout=30)
            prober = asyncio.create_task(
                watch_backends(pool, http, interval_s=settings.backend_health_interval_s)
            )
            sweeper = (
                asyncio.create_task(sweep_periodically(engine, settings))
                if retention_enabled(settings)
                else None
            )
            # What startup made lives as long as the process: out of the collector's sight, so
            # that the collections the requests' garbage triggers do not walk it each time.
            gc.collect()
            gc.freeze()
            try:
                yield
            finally:
                gc.unfreeze()
                refresher.cancel()
                prober.cancel()
                if sweeper is not None:
                    sweeper.cancel()
                await recorder.stop()
                await upstream.aclose()
                await engine.dispose()

    app = FastAPI(title="RL Gateway", version="0.1.0", lifespan=lifespan)
    app.state.children = children
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    app.add_middleware(ReleaseSlots)
    install_metrics(app)  # after the other middleware: it times them too
    install_error_handlers(app)
    app.include_router(openai_router)
    app.include_router(responses_router)
    app.include_router(anthropic_router)
    app.include_router(sessions_router)
    app.include_router(admin_router)
    app.include_router(admin_backends_router)
    app.include_router(admin_keys_router)
    app.include_router(admin_models_router)
    app.include_router(admin_tenants_router)
    app.include_router(register_router)
    app.include_router(health_router)
    app.include_router(dashboard_router)
    if fast_lanes:
        app.state.fast_lanes = install_fast_lanes(app)
    return app
