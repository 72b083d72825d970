"""Shared fixtures: a real Postgres, a real vLLM CPU server with the tiny model, a live gateway."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from migrations.runner import upgrade
from rlgw.db.engine import make_sync_engine, sync_session_factory
from rlgw.db.urls import to_libpq_uri, to_sqlalchemy_url
from rlgw.ports import free_port
from rlgw.settings import Settings
from rlgw_cli.serve import GatewayThread

DEFAULT_TEST_PG = "postgresql://postgres@127.0.0.1:5432/postgres"
ADMIN_KEY = "test-admin-key-0123456789"
MODEL_NAME = "tiny"
# The state directory of test gateways (journals of doubtful commits land here), removed at exit.
TEST_HOME = Path(tempfile.mkdtemp(prefix="rlgw-test-home-"))
atexit.register(shutil.rmtree, TEST_HOME, ignore_errors=True)


# ----------------------------------------------------------------------------- Postgres


@pytest.fixture(scope="session")
def pg_admin_uri(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A libpq URI of a server where tests may create databases: the local one, else embedded."""
    uri = os.environ.get("RLGW_TEST_DATABASE_URL", DEFAULT_TEST_PG)
    try:
        psycopg.connect(to_libpq_uri(uri), connect_timeout=3).close()
        yield to_libpq_uri(uri)
        return
    except psycopg.OperationalError:
        pass
    import pgserver

    server = pgserver.get_server(tmp_path_factory.mktemp("pgdata"), cleanup_mode="stop")
    yield server.get_uri()
    server.cleanup()


@pytest.fixture(scope="session")
def make_database(pg_admin_uri: str) -> Iterator[Callable[[], str]]:
    """Factory: a new empty database (SQLAlchemy URL), dropped at the end of the session."""
    created: list[str] = []

    def make() -> str:
        name = f"rlgw_test_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(pg_admin_uri, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        created.append(name)
        base, _, query = pg_admin_uri.partition("?")
        url = base.rsplit("/", 1)[0] + "/" + name + (f"?{query}" if query else "")
        return to_sqlalchemy_url(url)

    yield make
    with psycopg.connect(pg_admin_uri, autocommit=True) as conn:
        for name in created:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def database_url(make_database: Callable[[], str]) -> str:
    """One migrated database shared by the gateway tests."""
    url = make_database()
    upgrade(url)
    return url


# ----------------------------------------------------------------------------- vLLM


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trainer.models.init_model import create_model

    return create_model(tmp_path_factory.mktemp("models") / MODEL_NAME, preset="tiny", seed=0)


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def start_vllm_servers(
    model_dir: Path, log_dir: Path, count: int = 1, **launch
) -> list[tuple[object, str]]:
    """Start `count` vLLM CPU servers of the model at once; wait until all are healthy and warm.
    `launch`: more arguments of `start_backend` (e.g. `lora_rank`)."""
    from rlgw.backend_launcher import start_backend, stop_backend, wait_healthy

    started = []
    try:
        for _ in range(count):
            port = free_port()
            proc = start_backend(
                model_dir,
                port,
                served_model_name=MODEL_NAME,
                log_path=log_dir / f"vllm-{port}.log",
                **launch,
            )
            started.append((proc, f"http://127.0.0.1:{port}"))
        for proc, url in started:
            wait_healthy(url, timeout_s=420, proc=proc)
            # The first request warms the engine up; keep that out of the tests.
            httpx.post(
                f"{url}/v1/completions",
                timeout=300,
                json={"model": MODEL_NAME, "prompt": "warm up", "max_tokens": 4},
            )
    except BaseException:
        for proc, _ in started:
            stop_backend(proc)
        raise
    return started


def stop_vllm_servers(servers: list[tuple[object, str]]) -> None:
    from rlgw.backend_launcher import stop_backend

    for proc, _ in servers:
        stop_backend(proc)


@pytest.fixture(scope="session")
def vllm_url(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real vLLM CPU server with the tiny model, shared by the whole session."""
    servers = start_vllm_servers(tiny_model_dir, tmp_path_factory.mktemp("logs"))
    yield servers[0][1]
    stop_vllm_servers(servers)


# ----------------------------------------------------------------------------- gateway


LiveServer = GatewayThread  # a gateway on a real port, in a thread


def gateway_settings(database_url: str, **overrides) -> Settings:
    """Settings of a test gateway. Auth is off unless a test asks for it (the auth tests do):
    the suite predates agent keys and exercises everything else in the open loopback mode."""
    overrides.setdefault("auth", "off")
    overrides.setdefault("home", TEST_HOME)
    return Settings(database_url=database_url, admin_key=ADMIN_KEY, **overrides)


@pytest.fixture(scope="session")
def registered_backend(database_url: str, vllm_url: str, tiny_model_dir: Path) -> int:
    from rlgw.registry import register_backend

    engine = make_sync_engine(database_url)
    try:
        return register_backend(
            sync_session_factory(engine), MODEL_NAME, vllm_url, model_path=str(tiny_model_dir)
        )
    finally:
        engine.dispose()


@pytest.fixture(scope="session")
def gateway_url(database_url: str, registered_backend: int) -> Iterator[str]:
    from gateway.main import create_app

    app = create_app(gateway_settings(database_url))
    with LiveServer(app, free_port()) as live:
        yield live.url


@pytest.fixture(scope="session")
def admin_http(gateway_url: str) -> Iterator[httpx.Client]:
    """An HTTP client carrying the admin key."""
    with httpx.Client(
        base_url=gateway_url, timeout=30, headers={"Authorization": f"Bearer {ADMIN_KEY}"}
    ) as client:
        yield client


def fetch_record(admin_http: httpx.Client, completion_id: str, timeout_s: float = 10.0) -> dict:
    """The stored record of a completion, waiting briefly for records written after a response."""
    deadline = time.monotonic() + timeout_s
    while True:
        reply = admin_http.get(f"/admin/completions/{completion_id}")
        if reply.status_code == 200:
            return reply.json()
        if time.monotonic() > deadline:
            raise AssertionError(f"no record for {completion_id}: {reply.status_code} {reply.text}")
        time.sleep(0.1)
