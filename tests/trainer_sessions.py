"""Rewarded sessions of the tiny model written straight to the database, for trainer tests that
need no gateway and no vLLM."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from sqlalchemy.orm import Session

from rlgw.db.models import AgentSession, Completion, Reward
from rlgw.db.token_arrays import pack_ids, pack_logprobs

from conftest import MODEL_NAME


def rewarded_sessions(engine, rewards: list[float]) -> list[str]:
    """Closed sessions of one completion each of the tiny model, served by version 0, created
    one second apart (claims take the oldest first): the same in every database."""
    rng = random.Random(0)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    ids = []
    with Session(engine) as db, db.begin():
        for i, reward in enumerate(rewards):
            sid, at = f"s-{i:02d}", start + timedelta(seconds=i)
            db.add(AgentSession(id=sid, status="closed", created_at=at, closed_at=at))
            db.flush()
            output = [rng.randrange(3, 200) for _ in range(6)]
            db.add(
                Completion(
                    id=f"c-{i:02d}",
                    session_id=sid,
                    api="chat.completions",
                    model=MODEL_NAME,
                    policy_version=0,
                    prompt_token_ids=pack_ids([rng.randrange(3, 200) for _ in range(8)]),
                    output_token_ids=pack_ids(output),
                    output_logprobs=pack_logprobs([-5.5] * len(output)),
                    status="complete",
                    stream=False,
                    request={},
                    created_at=at,
                )
            )
            db.add(Reward(session_id=sid, value=reward, scope="session"))
            ids.append(sid)
    return ids
