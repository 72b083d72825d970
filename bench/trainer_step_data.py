"""Rewarded sessions in the recorded format, written straight to a fresh database, for the
trainer-step benchmark (bench/trainer_step.py): what the gateway would have stored for
`/v1/completions` calls (token ids, behaviour log-probs, the serving version), closed and
rewarded, so that the real trainer claims and trains them without a gateway in the way."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import torch
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from migrations.runner import upgrade
from rlgw import registry
from rlgw.db.models import AgentSession, Completion, Reward
from rlgw.db.token_arrays import pack_ids, pack_logprobs
from rlgw.db.urls import to_sqlalchemy_url
from trainer.loop.samples import Sample

BEHAVE_LOGPROB = -5.5  # about log(1/259): what a random byte-level policy gives each token


def fresh_database(pg: str, name: str) -> str:
    """Drop and create database `name` on the server `pg` (libpq URI without a database), bring
    it to the head migration; its SQLAlchemy URL."""
    with psycopg.connect(f"{pg}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    url = to_sqlalchemy_url(f"{pg}/{name}")
    upgrade(url)
    return url


def drop_database(pg: str, name: str) -> None:
    with psycopg.connect(f"{pg}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def register(engine: Engine, model: str, path: Path, backend_url: str | None) -> None:
    """The model (and its one backend, serving version 0) as `POST /register_model` stores it."""
    with Session(engine) as db, db.begin():
        probed = [(backend_url, 0)] if backend_url else []
        registry.store_model(db, model, probed, model_path=str(path), replace=False)


def seed_sessions(
    engine: Engine,
    model: str,
    *,
    version: int,
    sessions: int,
    tokens: int,
    seed: int,
    prompt: int | None = None,
    first: int = 0,
) -> list[Sample]:
    """`sessions` closed sessions of one completion each (`tokens` ids, `prompt` of them the
    prompt: a quarter by default), served by `version`, rewarded +1 and -1 in turn (counting from
    `first`); the samples the trainer will build from them."""
    gen = torch.Generator().manual_seed(seed)
    prompt = tokens // 4 if prompt is None else prompt
    now = datetime.now(UTC)
    samples = []
    with Session(engine) as db, db.begin():
        for i in range(sessions):
            ids = torch.randint(0, 256, (tokens,), generator=gen).tolist()
            sid, cid = f"bench-{uuid.uuid4().hex}", f"cmpl-{uuid.uuid4().hex}"
            behave = [BEHAVE_LOGPROB] * (tokens - prompt)
            reward = (-1.0) ** (first + i)
            db.add(AgentSession(id=sid, status="closed", train=True, closed_at=now))
            db.flush()
            db.add(
                Completion(
                    id=cid,
                    session_id=sid,
                    api="completions",
                    model=model,
                    policy_version=version,
                    prompt_token_ids=pack_ids(ids[:prompt]),
                    output_token_ids=pack_ids(ids[prompt:]),
                    output_logprobs=pack_logprobs(behave),
                    finish_reason="length",
                    status="complete",
                    stream=False,
                    request={"model": model, "prompt": ids[:prompt]},
                    created_at=now,
                    finished_at=now,
                )
            )
            db.flush()
            db.add(Reward(session_id=sid, completion_id=cid, value=reward, scope="completion"))
            samples.append(Sample(sid, cid, ids[:prompt], ids[prompt:], behave, reward, version))
    return samples
