"""`rlgw serve`: the gateway under uvicorn, in the foreground (one or several worker processes),
or in a thread of this process (the demo and the tests)."""

from __future__ import annotations

import argparse
import os
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any

import uvicorn

from migrations.runner import upgrade
from rlgw.settings import Settings

from .database import resolve_database_url
from .output import CommandError, info


def run_gateway(
    settings: Settings, *, workers: int = 1, children: Callable[[], dict] | None = None
) -> None:
    """Serve the gateway in the foreground; with `workers` > 1, as that many processes sharing
    the port (uvicorn's supervisor) and the database. `children`: what /healthz reports of the
    processes started beside it (one worker only)."""
    info(
        f"[rlgw] gateway on {settings.base_url}  (OpenAI base URL: {settings.base_url}/v1)"
        + (f"  [{workers} worker processes]" if workers > 1 else "")
    )
    options: dict[str, Any] = dict(
        host=settings.host,
        port=settings.port,
        log_level="warning",
        access_log=False,
        timeout_keep_alive=settings.keep_alive_s,
    )
    if workers <= 1:
        from gateway.main import create_app

        uvicorn.run(create_app(settings, children=children), **options)
        return
    # Each worker is a fresh process that builds its settings from the environment.
    os.environ.update(worker_environment(settings))
    uvicorn.run("gateway.main:create_app", factory=True, workers=workers, **options)


def worker_environment(settings: Settings) -> dict[str, str]:
    """What the worker processes must agree on, as RLGW_* variables: the database, the public
    address, and the secret that signs session tokens (a token minted by one worker must verify
    on every other; an unset secret becomes one random secret shared by this run's workers)."""
    env = {
        "RLGW_DATABASE_URL": str(settings.database_url),
        "RLGW_HOST": settings.host,
        "RLGW_PORT": str(settings.port),
    }
    if settings.token_secret_unset:
        env["RLGW_TOKEN_SECRET"] = secrets.token_urlsafe(32)
        if settings.auth == "on":
            info(
                "[rlgw] RLGW_TOKEN_SECRET is not set: the workers share a random secret of this "
                "run; session tokens stop working when it restarts"
            )
    return env


class GatewayThread:
    """An ASGI app served by uvicorn on a real port from a thread of this process (for `rlgw demo`
    and the tests: real HTTP, so streaming and disconnects behave as in production)."""

    def __init__(
        self, app: Any, port: int, host: str = "127.0.0.1", keep_alive_s: float = 75.0
    ) -> None:
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level="warning",
            lifespan="on",
            timeout_keep_alive=keep_alive_s,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True, name="gateway")
        self.url = f"http://{host}:{port}"

    def __enter__(self) -> GatewayThread:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the gateway did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def settings_from(args: argparse.Namespace) -> Settings:
    """Settings with the --host/--port a command was given."""
    overrides = {k: v for k in ("host", "port") if (v := getattr(args, k, None)) is not None}
    return Settings(**overrides)


def cmd_serve(args: argparse.Namespace) -> int:
    if args.workers < 1:
        raise CommandError("--workers must be at least 1", code=2)
    settings = settings_from(args)
    url = resolve_database_url(settings)
    upgrade(url)
    run_gateway(settings.model_copy(update={"database_url": url}), workers=args.workers)
    return 0


def add_commands(add) -> None:
    p = add("serve", cmd_serve, "Run the gateway against the configured database.")
    p.add_argument("--host", default=None, help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="port (default 8000)")
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="gateway processes sharing the port and the database (default 1)",
    )
