"""Running the gateway under uvicorn."""

from __future__ import annotations

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
    )
