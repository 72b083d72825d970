"""Claims against a real Postgres: `batch_sessions` counts sessions, pending groups never hide a
ready one, leases pass and are released, renewed only while live, and checked at commit; a
session that calls two models is claimed by each model once.

The sessions, completions and rewards are rows written here directly (the claim reads nothing
else); what a trainer does with a claim is tested end to end in tests/test_claims_e2e.py."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select, text
from sqlalchemy.orm import Session

from migrations.runner import upgrade
from rlgw.db.engine import make_sync_engine
from rlgw.db.models import (
    AgentSession,
    Completion,
    Consumption,
    RegisteredModel,
    Reward,
    SessionGroup,
)
from rlgw.db.token_arrays import pack_ids, pack_logprobs
from trainer.loop import claims
from trainer.loop.claims import claim_sessions, unclaim
from trainer.loop.leases import ClaimLost, check_held, renew_leases
from trainer.loop.settle import settle_consumed, settle_dropped

MODEL, OTHER = "tiny", "planner"
T0 = datetime(2026, 1, 1, tzinfo=UTC)
_clock = itertools.count()


@pytest.fixture
def engine(make_database: Callable[[], str]) -> Iterator:
    url = make_database()
    upgrade(url)
    engine = make_sync_engine(url)
    with Session(engine) as db, db.begin():
        db.add_all([RegisteredModel(name=MODEL), RegisteredModel(name=OTHER)])
    yield engine
    engine.dispose()


def tick() -> datetime:
    """Strictly increasing timestamps: the age order of what a test creates."""
    return T0 + timedelta(seconds=next(_clock))


def session(
    db: Session, *, group: str | None = None, reward: float | None = 1.0, models=(MODEL,)
) -> str:
    """A closed session with one completion per model in `models`, rewarded unless None."""
    sid = f"s-{uuid.uuid4().hex[:12]}"
    at = tick()
    db.add(AgentSession(id=sid, group_id=group, status="closed", created_at=at, closed_at=at))
    db.flush()
    for model in models:
        db.add(
            Completion(
                id=f"c-{uuid.uuid4().hex[:12]}",
                session_id=sid,
                api="chat.completions",
                model=model,
                policy_version=0,
                prompt_token_ids=pack_ids([1, 2]),
                output_token_ids=pack_ids([3]),
                output_logprobs=pack_logprobs([-0.5]),
                status="complete",
                stream=False,
                request={},
                created_at=at,
            )
        )
    if reward is not None:
        db.add(Reward(session_id=sid, value=reward, scope="session"))
    db.flush()
    return sid


def group(db: Session, size: int, *, rewarded: int | None = None) -> list[str]:
    """A group of `size` closed sessions, the first `rewarded` (default: all) rewarded: ready
    when all are, pending (its deadline ahead) otherwise."""
    gid = f"g-{uuid.uuid4().hex[:12]}"
    db.add(
        SessionGroup(
            id=gid,
            normalization="mean",
            expected_size=size,
            deadline_at=datetime.now(UTC) + timedelta(hours=1),
            created_at=tick(),
        )
    )
    db.flush()
    rewarded = size if rewarded is None else rewarded
    return [
        session(db, group=gid, reward=float(i % 2) if i < rewarded else None) for i in range(size)
    ]


def claim(engine, max_sessions: int, *, instance: int = 1, model: str = MODEL, lease_s=60.0):
    with Session(engine) as db, db.begin():
        return claim_sessions(
            db,
            model=model,
            instance_id=instance,
            max_sessions=max_sessions,
            reward_deadline_s=3600,
            now=datetime.now(UTC),
            lease_s=lease_s,
        )


def statuses(engine, ids: list[str]) -> dict[str, tuple[str, int | None]]:
    with Session(engine) as db:
        rows = db.execute(
            select(AgentSession.id, AgentSession.status, AgentSession.claimed_by).where(
                AgentSession.id.in_(ids)
            )
        )
        return {sid: (status, by) for sid, status, by in rows}


def test_batch_sessions_counts_sessions_not_groups(engine):
    with Session(engine) as db, db.begin():
        groups = [group(db, 8) for _ in range(8)]
    got = claim(engine, 8)
    assert sorted(got.session_ids) == sorted(groups[0])  # the oldest ready group, whole
    assert len(got.session_ids) == 8
    assert {s for s, _ in statuses(engine, groups[1]).values()} == {"closed"}


def test_a_group_larger_than_the_batch_is_taken_whole_only_when_nothing_else_is(engine):
    with Session(engine) as db, db.begin():
        small, big, later = group(db, 2), group(db, 8), group(db, 2)
    first = claim(engine, 4)
    assert sorted(first.session_ids) == sorted(small)  # the big one does not fit after it ...
    assert first.full  # ... so the batch is as full as whole groups allow (min_sessions met)
    assert not set(later) & set(first.session_ids)  # ... and nothing newer overtakes it
    second = claim(engine, 4)
    assert sorted(second.session_ids) == sorted(big)  # alone, it is taken whole
    assert sorted(claim(engine, 4).session_ids) == sorted(later)


def test_rewarded_singletons_fill_the_room_the_groups_leave(engine):
    with Session(engine) as db, db.begin():
        members = group(db, 3)
        singles = [session(db) for _ in range(10)]
        unrewarded = session(db, reward=None)
    got = claim(engine, 8)
    assert sorted(got.session_ids) == sorted(members + singles[:5])
    assert unrewarded not in got.session_ids


@pytest.mark.parametrize("page", [claims.GROUP_PAGE, 3])
def test_pending_groups_older_than_a_ready_one_do_not_hide_it(engine, monkeypatch, page):
    monkeypatch.setattr(claims, "GROUP_PAGE", page)  # 3: the ready group is on the third page
    with Session(engine) as db, db.begin():
        pending = [group(db, 8, rewarded=7) for _ in range(8)]
        ready = group(db, 8)
    got = claim(engine, 8)
    assert sorted(got.session_ids) == sorted(ready)
    assert {s for g in pending for s, _ in statuses(engine, g).values()} == {"closed"}


def expire(engine, ids: list[str]) -> None:
    """What the passing of time does to a lease no heartbeat renewed (set, not waited for)."""
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE sessions SET lease_expires_at = now() - interval '1 second' "
                 "WHERE id = ANY(:ids)"),
            {"ids": ids},
        )  # fmt: skip


def test_a_passed_lease_is_released_by_the_next_claim_and_taken_by_another_trainer(engine):
    with Session(engine) as db, db.begin():
        ids = [session(db) for _ in range(3)]
    assert sorted(claim(engine, 8, instance=1).session_ids) == sorted(ids)
    assert claim(engine, 8, instance=2).session_ids == []  # held: nothing for the other
    expire(engine, ids)
    taken = claim(engine, 8, instance=2)
    assert sorted(taken.released) == sorted(ids) and sorted(taken.session_ids) == sorted(ids)
    assert set(statuses(engine, ids).values()) == {("claimed", 2)}


def test_the_heartbeat_renews_live_leases_only(engine):
    with Session(engine) as db, db.begin():
        live, lost = session(db), session(db)
    claim(engine, 8, instance=1, lease_s=60)
    expire(engine, [lost])

    def lease(sid: str) -> datetime:
        with Session(engine) as db:
            return db.get(AgentSession, sid).lease_expires_at

    before = lease(live)
    assert renew_leases(engine, 1, 3600) == 1  # the live one, to an hour from now
    assert lease(live) > before + timedelta(minutes=30)
    assert lease(lost) < datetime.now(UTC)  # a lease that passed stays lost
    assert renew_leases(engine, 2, 3600) == 0  # another instance renews nothing of these


def test_a_trainer_commits_only_what_it_still_holds(engine):
    with Session(engine) as db, db.begin():
        ids = [session(db) for _ in range(2)]
    claim(engine, 8, instance=1)
    with Session(engine) as db, db.begin():
        check_held(db, ids, 1)  # held: no error
    expire(engine, ids[:1])
    with Session(engine) as db, db.begin(), pytest.raises(ClaimLost) as lost:
        check_held(db, ids, 1)
    assert lost.value.lost == ids[:1]
    with Session(engine) as db, db.begin():
        unclaim(db, ids, 1)  # gives back only what it still holds
    assert statuses(engine, ids) == {ids[0]: ("claimed", 1), ids[1]: ("closed", None)}


def model_id(db: Session, name: str) -> int:
    return db.scalar(select(RegisteredModel.id).where(RegisteredModel.name == name))


def consume(engine, sid: str, model: str) -> None:
    """What a trainer's commit does to a session it trained on: ledger rows, then settle."""
    with Session(engine) as db, db.begin():
        mid = model_id(db, model)
        for cid in db.scalars(
            select(Completion.id).where(Completion.session_id == sid, Completion.model == model)
        ):
            db.add(
                Consumption(model_id=mid, version=1, session_id=sid, completion_id=cid, used=True)
            )
        settle_consumed(db, db.get(AgentSession, sid), mid, datetime.now(UTC))


def test_a_session_of_two_models_is_claimed_by_each_model_once(engine):
    with Session(engine) as db, db.begin():
        both = session(db, models=(MODEL, OTHER))
        only = session(db)
    assert sorted(claim(engine, 8, model=MODEL).session_ids) == sorted([both, only])
    assert claim(engine, 8, instance=2, model=OTHER).session_ids == []  # one claim at a time
    consume(engine, both, MODEL)
    consume(engine, only, MODEL)
    assert statuses(engine, [both, only]) == {both: ("closed", None), only: ("consumed", 1)}
    assert claim(engine, 8, model=MODEL).session_ids == []  # the first model had it once
    assert claim(engine, 8, instance=2, model=OTHER).session_ids == [both]
    consume(engine, both, OTHER)
    assert statuses(engine, [both])[both][0] == "consumed"  # every model had it


def test_a_drop_for_one_model_does_not_drop_the_session_for_the_other(engine):
    with Session(engine) as db, db.begin():
        both = session(db, models=(MODEL, OTHER))
    assert claim(engine, 8, instance=2, model=OTHER).session_ids == [both]
    with Session(engine) as db, db.begin():
        other = model_id(db, OTHER)
        settle_dropped(db, db.get(AgentSession, both), other, "nothing trainable", T0)
    assert statuses(engine, [both]) == {both: ("closed", None)}
    assert claim(engine, 8, instance=2, model=OTHER).session_ids == []  # dropped for it
    assert claim(engine, 8, model=MODEL).session_ids == [both]  # not for the other
    consume(engine, both, MODEL)
    assert statuses(engine, [both])[both][0] == "consumed"
