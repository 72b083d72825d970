"""`rlgw serve` as a real subprocess (one or several workers) for tests that need separate
processes: replicas sharing a database, the short soak."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from bench.processes import start_server, stop_group

from conftest import free_port

RLGW = Path(sys.executable).with_name("rlgw")


@contextmanager
def serve_process(
    database_url: str, *, workers: int = 1, log_path: Path, **env: str
) -> Iterator[str]:
    """Run `rlgw serve --workers N` on a free port; yield its URL once /healthz answers 200."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_server(
        [str(RLGW), "serve", "--port", str(port), "--workers", str(workers)],
        env={**os.environ, "RLGW_DATABASE_URL": database_url, **env},
        log_path=log_path,
        ready_url=f"{url}/healthz",
        name="rlgw serve",
        timeout_s=90,
    )
    try:
        yield url
    finally:
        stop_group(proc, timeout_s=30)


def processes_seen(url: str, attempts: int = 200) -> set[int]:
    """The worker processes that answered /healthz over fresh connections (stops at two)."""
    seen: set[int] = set()
    for _ in range(attempts):
        seen.add(httpx.get(f"{url}/healthz", timeout=5).json()["process"])
        if len(seen) >= 2:
            break
    return seen
