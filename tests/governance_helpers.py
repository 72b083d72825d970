"""Shared by the governance tests (tests/test_governance_data.py, tests/test_key_consent.py): a
gateway with auth on over its own database, agents of tenants, a trainer with no backend, and
the CLI run in-process."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from sqlalchemy import create_engine, text

from gateway.main import create_app
from migrations.runner import upgrade
from rlgw import agent_keys
from rlgw.db.engine import make_sync_engine, sync_session_factory
from rlgw.registry import register_backend
from rlgw_cli.main import main as rlgw_main
from trainer.config import TrainerConfig
from trainer.loop.service import OnlineTrainer

from conftest import ADMIN_KEY, MODEL_NAME, LiveServer, free_port, gateway_settings

TOKEN_SECRET = "test-token-secret-0123456789-abcdefghij"


class Env:
    def __init__(self, db_url: str, gateway: str, backend: str, model_dir: Path, home: Path):
        self.db_url, self.gateway, self.backend, self.model_dir = (
            db_url,
            gateway,
            backend,
            model_dir,
        )
        self.settings = gateway_settings(db_url, auth="on", token_secret=TOKEN_SECRET)
        self.settings = self.settings.model_copy(update={"home": home})
        self.engine = create_engine(db_url)
        self.admin = httpx.Client(base_url=gateway, timeout=60, headers={"X-Admin-Key": ADMIN_KEY})
        self.keys: dict[str, str] = {}

    def key(self, tenant: str) -> str:
        if tenant not in self.keys:
            with sync_session_factory(self.engine)() as db, db.begin():
                self.keys[tenant] = agent_keys.mint(db, tenant)[1]
        return self.keys[tenant]

    def agent(self, tenant: str) -> httpx.Client:
        return httpx.Client(
            base_url=self.gateway,
            timeout=120,
            headers={"Authorization": f"Bearer {self.key(tenant)}"},
        )

    def episode(self, tenant: str, reward: float | None = 1.0, close: bool = True, **body) -> str:
        """A session of `tenant` with one completion; rewarded and closed unless told otherwise."""
        with self.agent(tenant) as http:
            session = http.post("/v1/sessions", json=body).json()
            openai.OpenAI(
                base_url=session["base_url"], api_key=self.key(tenant)
            ).chat.completions.create(
                model=MODEL_NAME, messages=[{"role": "user", "content": "Say A"}], max_tokens=4
            )
            if reward is not None:
                assert (
                    http.post(
                        f"/v1/sessions/{session['id']}/rewards", json={"value": reward}
                    ).status_code
                    == 201
                )
            if close:
                http.post(f"/v1/sessions/{session['id']}/close")
        return session["id"]

    def rows(self, sql: str, **params) -> list[tuple]:
        with self.engine.connect() as conn:
            return [tuple(r) for r in conn.execute(text(sql), params)]

    @contextlib.contextmanager
    def trainer(self) -> Iterator[OnlineTrainer]:
        """A trainer while the model has no backend: versions are recorded, nothing is swapped."""
        (backend_id,) = self.rows("SELECT id FROM backends")[0]
        with self.engine.begin() as conn:
            conn.execute(text("DELETE FROM backends"))
            conn.execute(text("SELECT pg_notify('rlgw_backends', 'gone')"))
        engine = make_sync_engine(self.db_url)
        trainer = OnlineTrainer(
            self.settings, engine, MODEL_NAME, TrainerConfig(batch_sessions=32), log=print
        )
        try:
            yield trainer
        finally:
            trainer.close()
            engine.dispose()
            register_backend(sync_session_factory(self.engine), MODEL_NAME, self.backend)


def governance_env(make_database, vllm_url, tiny_model_dir, tmp_path_factory) -> Iterator[Env]:
    """A migrated database with the model registered on the suite's vLLM server, and a gateway
    with auth on (the body of a module-scoped `env` fixture)."""
    db_url = make_database()
    upgrade(db_url)
    engine = make_sync_engine(db_url)
    register_backend(
        sync_session_factory(engine), MODEL_NAME, vllm_url, model_path=str(tiny_model_dir)
    )
    engine.dispose()
    settings = gateway_settings(db_url, auth="on", token_secret=TOKEN_SECRET)
    with LiveServer(create_app(settings), free_port()) as gw:
        yield Env(db_url, gw.url, vllm_url, tiny_model_dir, tmp_path_factory.mktemp("home"))


def statuses(env: Env, session_ids: list[str]) -> set[str]:
    return {
        s for (s,) in env.rows("SELECT status FROM sessions WHERE id = ANY(:ids)", ids=session_ids)
    }


def rlgw(env: Env, *argv: str, capsys) -> tuple[int, str, str]:
    capsys.readouterr()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RLGW_DATABASE_URL", env.db_url)
        mp.setenv("RLGW_HOME", str(env.settings.home))
        with pytest.raises(SystemExit) as exited:
            rlgw_main(list(argv))
    out, err = capsys.readouterr()
    return exited.value.code, out, err
