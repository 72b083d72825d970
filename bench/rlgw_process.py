"""A real `rlgw serve` subprocess on a fresh database of its own, for benchmarks (created, migrated
by `rlgw serve` itself, and dropped on exit), with helpers to register a backend and read records.

    with RlgwServer(port, pg="postgresql://postgres@127.0.0.1:5432") as gw:
        gw.register("bench", "http://127.0.0.1:9000")
        ...  # OpenAI base URL: gw.url + "/v1"

Request limits are lifted (RLGW_RATE_LIMIT_RPS=0, RLGW_MAX_CONCURRENCY_PER_KEY=0) and auth is off
(a loopback bind): the benchmark measures the recording path, not the limiter's refusals.
bench/gateway_overhead.py and bench/soak.py use it: keep `RlgwServer(port, *, pg, workers,
log_path, extra_env)`, `url`, `db`, `admin_key`, `register`, `record`, `record_counts`, `stop`.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import psycopg

from bench.processes import start_server, stop_group

REPO = Path(__file__).resolve().parents[1]
RLGW = REPO / ".venv" / "bin" / "rlgw"
BENCH_ENV = {"RLGW_AUTH": "off", "RLGW_RATE_LIMIT_RPS": "0", "RLGW_MAX_CONCURRENCY_PER_KEY": "0"}


class RlgwServer:
    """`rlgw serve --port P [--workers W]` on database rlgw_bench_<random>, dropped on exit."""

    def __init__(
        self,
        port: int,
        *,
        pg: str = "postgresql://postgres@127.0.0.1:5432",
        workers: int = 1,
        log_path: Path | None = None,
        extra_env: dict[str, str] | None = None,
    ) -> None:
        self.port, self.pg, self.workers = port, pg.rstrip("/"), workers
        self.db = "rlgw_bench_" + secrets.token_hex(4)
        self.admin_key = secrets.token_urlsafe(32)
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log_path or Path(tempfile.gettempdir()) / f"rlgw-bench-{port}.log"
        self.home = tempfile.mkdtemp(prefix="rlgw-bench-home-")
        self.env = {
            **os.environ,
            **BENCH_ENV,
            "RLGW_DATABASE_URL": f"{self.pg}/{self.db}",
            "RLGW_ADMIN_KEY": self.admin_key,
            "RLGW_HOME": self.home,
            **(extra_env or {}),
        }
        self.proc: subprocess.Popen | None = None

    def _admin_sql(self, sql: str) -> None:
        with psycopg.connect(f"{self.pg}/postgres", autocommit=True) as conn:
            conn.execute(sql)

    def start(self, timeout_s: float = 60.0) -> RlgwServer:
        self._admin_sql(f"CREATE DATABASE {self.db}")
        cmd = [str(RLGW), "serve", "--host", "127.0.0.1", "--port", str(self.port)]
        if self.workers > 1:
            cmd += ["--workers", str(self.workers)]
        try:
            self.proc = start_server(
                cmd,
                env=self.env,
                log_path=self.log_path,
                ready_url=self.url + "/v1/models",
                name="rlgw serve",
                timeout_s=timeout_s,
            )
        except RuntimeError:
            self.stop()  # drops the database
            raise
        return self

    def register(
        self, model: str, backend_url: str, timeout_s: float = 30.0, path: Path | None = None
    ) -> None:
        """`rlgw register` (with the checkpoint's `path`, which a push needs), then wait until
        the running gateway routes the model."""
        cmd = [str(RLGW), "register", "--model", model, "--url", backend_url]
        if path is not None:
            cmd += ["--path", str(path)]
        done = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"rlgw register failed: {done.stderr.strip() or done.stdout}")
        deadline = time.monotonic() + timeout_s
        while model not in self.models():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the gateway does not route {model!r} after registration")
            time.sleep(0.2)

    def models(self) -> list[str]:
        reply = httpx.get(self.url + "/v1/models", timeout=5.0, trust_env=False).json()
        return [m["id"] for m in reply.get("data", [])]

    def record(self, completion_id: str) -> dict:
        """GET /admin/completions/{id}: the stored record."""
        headers = {"Authorization": f"Bearer {self.admin_key}"}
        url = f"{self.url}/admin/completions/{completion_id}"
        reply = httpx.get(url, headers=headers, trust_env=False)
        reply.raise_for_status()
        return reply.json()

    def record_counts(self) -> dict[str, int]:
        """Stored completions by `<status>/<eligible|not eligible>` (read from the database)."""
        sql = "SELECT status, ineligible_reasons = '{}', count(*) FROM completions GROUP BY 1, 2"
        with psycopg.connect(f"{self.pg}/{self.db}") as conn:
            rows = conn.execute(sql).fetchall()
        return {f"{s}/{'eligible' if e else 'not eligible'}": n for s, e, n in rows}

    def stop(self) -> None:
        stop_group(self.proc)  # its own session: workers too
        self.proc = None
        try:
            self._admin_sql(f"DROP DATABASE IF EXISTS {self.db} WITH (FORCE)")
        except psycopg.Error as exc:
            print(f"[bench] could not drop database {self.db}: {exc}", flush=True)
        shutil.rmtree(self.home, ignore_errors=True)

    def __enter__(self) -> RlgwServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
