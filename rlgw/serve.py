"""Running the gateway under uvicorn: in the foreground, or in a thread of this process."""

from __future__ import annotations

import threading
import time
from typing import Any

import uvicorn

from rlgw.settings import Settings


def run_gateway(settings: Settings) -> None:
    from gateway.main import create_app

    print(
        f"[rlgw] gateway on {settings.base_url}  (OpenAI base URL: {settings.base_url}/v1)",
        flush=True,
    )
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level="warning",
        access_log=False,
        timeout_keep_alive=settings.keep_alive_s,
    )


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
