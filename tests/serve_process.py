"""`rlgw serve` as a real subprocess (one or several workers) for tests that need separate
processes: replicas sharing a database, memory measured from outside."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from conftest import free_port

RLGW = Path(sys.executable).with_name("rlgw")


@contextmanager
def serve_process(
    database_url: str, *, workers: int = 1, log_path: Path, **env: str
) -> Iterator[str]:
    """Run `rlgw serve --workers N` on a free port; yield its URL once /healthz answers."""
    port = free_port()
    environment = {**os.environ, "RLGW_DATABASE_URL": database_url, **env}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [str(RLGW), "serve", "--port", str(port), "--workers", str(workers)],
            env=environment,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"rlgw serve exited: {log_path.read_text()[-2000:]}")
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code in (200, 503):
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"rlgw serve did not start: {log_path.read_text()[-2000:]}")
            time.sleep(0.3)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def processes_seen(url: str, attempts: int = 200) -> set[int]:
    """The worker processes that answered /healthz over fresh connections (stops at two)."""
    seen: set[int] = set()
    for _ in range(attempts):
        seen.add(httpx.get(f"{url}/healthz", timeout=5).json()["process"])
        if len(seen) >= 2:
            break
    return seen
