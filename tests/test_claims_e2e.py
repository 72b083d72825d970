"""Claims end to end, with the real tiny vLLM server, gateway and trainers: a trainer stopped
(SIGSTOP) while it holds a claim loses it once its lease passes, another trains those sessions,
and the first, continued, commits nothing; a session that calls two models is trained by both
trainers, each on its own completions only, and a token id outside a model's vocabulary never
reaches its forward pass."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import openai
import pytest
from sqlalchemy import select, text
from test_trainer_e2e import Env, current_version, drain_queue, trainer_env

from gateway.recording.record import CompletionRecord
from gateway.recording.store import store_batch
from rlgw.db.engine import make_async_engine, make_sync_engine, sync_session_factory
from rlgw.db.models import AgentSession, Consumption, RegisteredModel
from rlgw.registry import store_model
from rlgw.test_hooks import COMMIT_DELAY_ENV, FAULT_ENV
from trainer.config import TrainerConfig
from trainer.loop.service import OnlineTrainer
from trainer.models.init_model import create_model

from conftest import (
    MODEL_NAME,
)

LEASE_S = 2.0  # the stopped trainer's lease: short, so that the test need not wait long
PLANNER = "tiny-planner"  # the second model of the two-model session (no backend: see below)


@pytest.fixture(scope="module")
def env(make_database, tiny_model_dir, tmp_path_factory) -> Iterator[Env]:
    yield from trainer_env(make_database, tiny_model_dir, tmp_path_factory, "claims")


def wait_for(what: str, condition, timeout_s: float) -> None:
    """Poll `condition` until true; the bound only turns a hang into a failure."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def scalar(env: Env, sql: str, **params):
    with env.db() as db:
        return db.execute(text(sql), params).scalar()


def start_trainer(env: Env, log: Path) -> subprocess.Popen:
    """`rlgw train` with a short lease, holding each update 20 s before its commit."""
    environment = {
        **os.environ,
        "RLGW_DATABASE_URL": env.db_url,
        "RLGW_HOME": str(env.home),
        "RLGW_CLAIM_LEASE_S": str(LEASE_S),
        COMMIT_DELAY_ENV: "20",
        "PYTHONUNBUFFERED": "1",
    }
    environment.pop(FAULT_ENV, None)
    argv = [sys.executable, "-m", "rlgw_cli", "train", "--model", MODEL_NAME]
    return subprocess.Popen(
        [*argv, "--batch-sessions", "16"],
        env=environment,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )


def test_a_stopped_trainer_loses_its_claim_and_commits_nothing_it_no_longer_holds(env, tmp_path):
    drain_queue(env)
    episodes = [env.episode(r) for r in (1.0, 0.0, 1.0)]
    ids = [s for s, _ in episodes]
    version = current_version(env)
    log = tmp_path / "stopped-trainer.log"
    first = start_trainer(env, log)
    try:
        claimed = "SELECT count(*) FROM sessions WHERE id = ANY(:ids) AND status = 'claimed'"
        wait_for("the first trainer's claim", lambda: scalar(env, claimed, ids=ids) == 3, 240)
        first.send_signal(signal.SIGSTOP)  # it holds the claim; its heartbeat stops with it
        passed = (
            "SELECT bool_and(lease_expires_at < clock_timestamp()) FROM sessions "
            "WHERE id = ANY(:ids)"
        )
        wait_for("the lease to pass", lambda: scalar(env, passed, ids=ids), 60)

        second = env.trainer()
        report = second.step()  # releases the passed leases, claims and trains the sessions
        second.close()
        assert report is not None and report.version == version + 1
        assert sorted(report_ids(env, version + 1)) == sorted(ids)

        first.send_signal(signal.SIGCONT)
        wait_for(
            "the first trainer to give its update up",
            lambda: "not committed" in log.read_text(),
            120,
        )
        wait_for(
            "the first trainer to continue from the new version",
            lambda: f"continuing from version {version + 1}" in log.read_text(),
            120,
        )
    finally:
        first.send_signal(signal.SIGCONT)
        first.terminate()
        first.wait(timeout=60)
    output = log.read_text()
    assert "3 claimed session(s) lost" in output, output
    assert current_version(env) == version + 1  # no second version from those sessions
    used = [(v, s, c) for v, s, c, ok, _ in env.ledger() if ok and s in set(ids)]
    assert sorted(used) == sorted((version + 1, s, c) for s, c in episodes)  # exactly once
    with env.db() as db:
        assert {db.get(AgentSession, s).status for s in ids} == {"consumed"}


def report_ids(env: Env, version: int) -> list[str]:
    with env.db() as db:
        return list(
            db.scalars(
                select(Consumption.session_id).distinct().where(Consumption.version == version)
            )
        )


def planner_completion(session_id: str, token_ids: list[int]) -> CompletionRecord:
    """A completion of the planner model in `session_id`, as the gateway's recorder stores it
    (the planner has no vLLM server here: a second server of the tiny model would double the
    test's memory and start-up for nothing the trainer reads)."""
    rid = "chatcmpl-" + uuid.uuid4().hex
    now = datetime.now(UTC)
    return CompletionRecord(
        id=rid,
        session_id=session_id,
        implicit_session=False,
        api="completions",
        model=PLANNER,
        stream=False,
        request={"model": PLANNER, "prompt": "plan"},
        created_at=now,
        finished_at=now,
        policy_version=0,
        prompt_token_ids=[5, 6, 7],
        output_token_ids=token_ids,
        output_logprobs=[-1.0] * len(token_ids),
        finish_reason="stop",
        status="complete",
        retry_group=uuid.uuid4().hex,
        response={"id": rid, "choices": [{"index": 0, "text": "plan"}]},
    )


async def store(db_url: str, records: list[CompletionRecord]) -> None:
    engine = make_async_engine(db_url)
    try:
        await store_batch(engine, [[r] for r in records], settle_first=False)
    finally:
        await engine.dispose()


def ledger_of(env: Env, model: str, session_id: str) -> dict[str, tuple[bool, str | None]]:
    """The model's ledger rows of the session: completion id -> (used, reason)."""
    with env.db() as db:
        rows = db.execute(
            select(Consumption.completion_id, Consumption.used, Consumption.reason)
            .join(RegisteredModel, RegisteredModel.id == Consumption.model_id)
            .where(RegisteredModel.name == model, Consumption.session_id == session_id)
        )
        return {cid: (used, reason) for cid, used, reason in rows}


def test_a_session_of_two_models_trains_each_model_on_its_own_completions(env, tmp_path):
    drain_queue(env)
    planner_dir = create_model(tmp_path / PLANNER, preset="tiny", seed=1)
    engine = make_sync_engine(env.db_url)
    with sync_session_factory(engine)() as db, db.begin():
        store_model(db, PLANNER, [], model_path=str(planner_dir), replace=False)
    s = env.http.post("/v1/sessions", json={}).json()
    worker = openai.OpenAI(base_url=s["base_url"], api_key="unused").chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "Say A"}], max_tokens=6
    )
    plan = planner_completion(s["id"], [8, 9])
    beyond = planner_completion(s["id"], [10, 1_000_000])  # outside the planner's vocabulary
    asyncio.run(store(env.db_url, [plan, beyond]))
    assert env.http.post(f"/v1/sessions/{s['id']}/rewards", json={"value": 1.0}).status_code == 201
    env.http.post(f"/v1/sessions/{s['id']}/close")

    planner = OnlineTrainer(
        env.settings, engine, PLANNER, TrainerConfig(lr=1e-3, batch_sessions=16), log=print
    )
    report = planner.step()
    planner.close()
    assert report is not None and report.version == 1 and report.samples == 1
    planned = ledger_of(env, PLANNER, s["id"])
    assert set(planned) == {plan.id, beyond.id}  # nothing of the worker's
    assert planned[plan.id] == (True, None)
    used, reason = planned[beyond.id]
    assert not used and "outside the model's vocabulary" in reason
    with env.db() as db:  # back in the queue: the worker model has still to train on it
        assert db.get(AgentSession, s["id"]).status == "closed"

    worker_trainer = env.trainer()
    report = worker_trainer.step()
    worker_trainer.close()
    engine.dispose()
    assert report is not None and report.samples == 1
    assert ledger_of(env, MODEL_NAME, s["id"]) == {worker.id: (True, None)}  # its own only
    with env.db() as db:
        assert db.get(AgentSession, s["id"]).status == "consumed"
