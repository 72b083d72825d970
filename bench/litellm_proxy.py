"""The LiteLLM proxy as the comparison gateway: installed into its own virtualenv
(bench/.litellm-venv, idempotent), configured by a generated YAML, run as a subprocess.

The version is pinned (LITELLM_VERSION): litellm 1.82.7 and 1.82.8 on PyPI carried a credential
stealer (March 2026; 1.82.8 through a `litellm_init.pth` file that runs at every interpreter start),
so an unpinned install is not acceptable. The install refuses a virtualenv holding such a file.

Configuration: one `openai/<model>` entry whose api_base is the fake upstream, no database, no
callbacks, no master key (the proxy's open mode, as rlgw runs with auth off), access log off (rlgw
runs without one too), one uvicorn worker, uvloop (LiteLLM's default), keep-alive 75 s.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from bench.processes import start_server, stop_group

BENCH = Path(__file__).resolve().parent
VENV = BENCH / ".litellm-venv"
LITELLM_VERSION = "1.82.6"
BAD_PTH = "litellm_init.pth"


def _python() -> Path:
    return VENV / "bin" / "python"


def _check_clean() -> None:
    found = list(VENV.glob(f"lib/python*/site-packages/{BAD_PTH}"))
    if found:
        raise RuntimeError(f"{found[0]} exists: a compromised litellm was installed; delete {VENV}")


def ensure_litellm(version: str = LITELLM_VERSION, log: Callable[[str], None] = print) -> Path:
    """Create bench/.litellm-venv and install litellm[proxy]==version unless already done; return
    the `litellm` executable. Prints progress lines (a first install takes a few minutes)."""
    marker = VENV / f".installed-litellm-{version}"
    exe = VENV / "bin" / "litellm"
    if marker.exists() and exe.exists():
        _check_clean()
        log(f"litellm {version} already installed in {VENV}")
        return exe
    if not _python().exists():
        log(f"creating virtualenv {VENV}")
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    log(f"installing litellm[proxy]=={version} into {VENV} (first time: a few minutes)")
    cmd = [str(_python()), "-m", "pip", "install", "--disable-pip-version-check"]
    cmd.append(f"litellm[proxy]=={version}")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(("Collecting", "Installing", "Successfully", "ERROR")):
            log("  pip: " + line.rstrip()[:150])
    if proc.wait() != 0:
        raise RuntimeError(f"pip install litellm[proxy]=={version} failed (exit {proc.returncode})")
    _check_clean()
    marker.write_text(version + "\n")
    log(f"litellm {version} installed")
    return exe


PG_LOGGER = BENCH / "litellm_pg_logger.py"
PG_LOGGER_DSN_ENV = "RLGW_BENCH_LITELLM_PG"  # bench/litellm_pg_logger.py reads it


def write_config(
    directory: Path, model: str, upstream_url: str, pg_log: bool = False
) -> tuple[Path, Path]:
    """The proxy's YAML config and a logging config that silences the access log. With `pg_log`,
    every successful call is logged to Postgres by bench/litellm_pg_logger.py (copied beside the
    config, where LiteLLM looks for a custom callback's module)."""
    config = directory / "litellm_config.yaml"
    callbacks = ""
    if pg_log:
        shutil.copyfile(PG_LOGGER, directory / "pg_request_log.py")
        callbacks = '  callbacks: ["pg_request_log.proxy_handler_instance"]\n'
    config.write_text(
        "model_list:\n"
        f"  - model_name: {model}\n"
        "    litellm_params:\n"
        f"      model: openai/{model}\n"
        f"      api_base: {upstream_url}/v1\n"
        "      api_key: unused\n"
        "litellm_settings:\n"
        "  telemetry: false\n" + callbacks
    )
    logging = directory / "litellm_logging.json"
    handler = {"class": "logging.StreamHandler", "stream": "ext://sys.stderr"}
    logging.write_text(
        json.dumps(
            {
                "version": 1,
                "disable_existing_loggers": False,
                "handlers": {"stderr": handler},
                "loggers": {
                    "uvicorn": {"handlers": ["stderr"], "level": "WARNING"},
                    "uvicorn.error": {"level": "WARNING"},
                    "uvicorn.access": {"handlers": [], "level": "WARNING", "propagate": False},
                },
            }
        )
    )
    return config, logging


class LiteLLMProxy:
    """`litellm --config ... --port P` in its own session; `url` is its base URL."""

    def __init__(
        self, port: int, model: str, upstream_url: str, workdir: Path, pg_log_dsn: str | None = None
    ) -> None:
        self.port, self.model, self.upstream_url, self.workdir = port, model, upstream_url, workdir
        self.pg_log_dsn = pg_log_dsn  # log every call to this database (bench/litellm_pg_logger)
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = workdir / f"litellm-{port}.log"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 180.0) -> LiteLLMProxy:
        exe = VENV / "bin" / "litellm"
        config, logging = write_config(
            self.workdir, self.model, self.upstream_url, pg_log=self.pg_log_dsn is not None
        )
        cmd = [str(exe), "--config", str(config), "--host", "127.0.0.1", "--port", str(self.port)]
        cmd += ["--num_workers", "1", "--keepalive_timeout", "75", "--log_config", str(logging)]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "DATABASE_URL"))}
        env |= {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR"}
        if self.pg_log_dsn is not None:
            env[PG_LOGGER_DSN_ENV] = self.pg_log_dsn
        self.proc = start_server(
            cmd,
            env=env,
            log_path=self.log_path,
            ready_url=self.url + "/health/liveliness",
            name="LiteLLM",
            timeout_s=timeout_s,
            poll_s=0.5,
        )
        return self

    def stop(self) -> None:
        stop_group(self.proc)
        self.proc = None

    def __enter__(self) -> LiteLLMProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# The table bench/litellm_pg_logger.py inserts into.
REQUEST_LOG_TABLE = (
    "CREATE TABLE request_log (id bigserial PRIMARY KEY, call_id text, model text, "
    "request jsonb NOT NULL, response jsonb NOT NULL, started timestamptz, ended timestamptz)"
)


class RequestLogDatabase:
    """A fresh database rlgw_bench_litellm_<random> with bench/litellm_pg_logger.py's table,
    dropped on exit; `dsn` is its URL, `rows()` the calls logged so far."""

    def __init__(self, pg: str) -> None:
        self.pg = pg.rstrip("/")
        self.db = "rlgw_bench_litellm_" + secrets.token_hex(4)
        self.dsn = f"{self.pg}/{self.db}"

    def __enter__(self) -> RequestLogDatabase:
        import psycopg

        with psycopg.connect(f"{self.pg}/postgres", autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {self.db}")
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(REQUEST_LOG_TABLE)
        return self

    def rows(self) -> int:
        import psycopg

        with psycopg.connect(self.dsn) as conn:
            return conn.execute("SELECT count(*) FROM request_log").fetchone()[0]

    def __exit__(self, *exc: object) -> None:
        import psycopg

        with psycopg.connect(f"{self.pg}/postgres", autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {self.db} WITH (FORCE)")
