"""A version published in the background while the next update computes, end to end without vLLM
(real Postgres, the tiny model on the CPU, no backend registered): the versions, their files,
their ledger and the AdamW moments are exactly those of one update after the other, and a version
that cannot be recorded takes the update built on it down with it."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import torch
from sqlalchemy import select
from sqlalchemy.orm import Session
from trainer_sessions import rewarded_sessions

from migrations.runner import upgrade
from rlgw.db.engine import make_sync_engine, sync_session_factory
from rlgw.db.models import AgentSession, Consumption, PolicyVersion
from rlgw.registry import store_model
from trainer.config import TrainerConfig
from trainer.loop.leases import ClaimLost
from trainer.loop.optimizer_state import saved_states, state_path
from trainer.loop.service import OnlineTrainer
from trainer.models.weights import state_dict

from conftest import MODEL_NAME, gateway_settings

REWARDS = [1.0, -1.0, 0.5, -0.5, 1.0, 0.0, -1.0, 0.25]  # two updates of four sessions


def trainer_on_fresh_database(make_database, tiny_model_dir: Path, home: Path, **overrides):
    db_url = make_database()
    upgrade(db_url)
    engine = make_sync_engine(db_url)
    with sync_session_factory(engine)() as db, db.begin():
        store_model(db, MODEL_NAME, [], model_path=str(tiny_model_dir), replace=False)
    rewarded_sessions(engine, REWARDS)
    settings = gateway_settings(db_url).model_copy(update={"home": home})
    config = TrainerConfig(lr=1e-3, batch_sessions=4, **overrides)
    lines: list[str] = []
    return OnlineTrainer(settings, engine, MODEL_NAME, config, log=lines.append), engine, lines


def versions(engine) -> list[tuple[int, int, str]]:
    with Session(engine) as db:
        rows = db.execute(
            select(PolicyVersion.version, PolicyVersion.parent_version, PolicyVersion.checksum)
            .where(PolicyVersion.version > 0)
            .order_by(PolicyVersion.version)
        ).all()
    return [tuple(r) for r in rows]


def consumed(engine) -> dict[str, int]:
    """The ledger: the version whose update used each session."""
    with Session(engine) as db:
        return dict(db.execute(select(Consumption.session_id, Consumption.version)).all())


@pytest.mark.parametrize("lora_rank", [0, 4], ids=["full", "lora"])
def test_overlapped_versions_are_byte_for_byte_those_of_one_update_after_the_other(
    make_database, tiny_model_dir: Path, tmp_path: Path, lora_rank: int
) -> None:
    """Version 1 is recorded only once version 2's update has changed the model and the AdamW
    moments (forced, below): what it records is still version 1's own."""
    made = {}
    for mode in ("sequential", "overlapped"):
        trainer, engine, lines = trainer_on_fresh_database(
            make_database, tiny_model_dir, tmp_path / mode, lora_rank=lora_rank
        )
        try:
            if mode == "sequential":
                reports = [trainer.step(), trainer.step()]
            else:
                assert trainer._overlaps()  # shared placement, no gate, no native transfer
                second_update_done = hold_records_until_the_next_update(trainer)
                assert trainer.advance() is None  # version 1 is being published meanwhile
                assert trainer.inflight is not None
                first = trainer.advance()  # version 2 computed while 1 was published
                assert second_update_done.is_set()
                reports = [first, trainer.finish()]
                assert trainer.inflight is None
            weights = {k: v.clone() for k, v in state_dict(trainer.model).items()}
        finally:
            trainer.close()
        assert [r.version for r in reports] == [1, 2], lines
        assert [r.samples for r in reports] == [4, 4]
        path = state_path(tmp_path / mode, MODEL_NAME)
        moments = saved_states(path)[::-1]  # version 1's (kept beside) and version 2's
        configs = [
            json.loads(path.read_text())
            for path in sorted((tmp_path / mode).rglob("adapter_config.json"))
        ]
        made[mode] = (versions(engine), consumed(engine), weights, moments, reports, configs)
        engine.dispose()
    seq, ovl = made["sequential"], made["overlapped"]
    # The same versions on the same parents, their files bitwise the same (checksums)
    assert ovl[0] == seq[0] and [(v, p) for v, p, _ in ovl[0]] == [(1, 0), (2, 1)]
    # each session consumed once, by the same version
    assert ovl[1] == seq[1] and len(ovl[1]) == 8 and sorted(set(ovl[1].values())) == [1, 2]
    for name, tensor in seq[2].items():  # the trainer ends on the same weights
        assert torch.equal(ovl[2][name], tensor), name
    # the moments saved with each version are those it reached, not the next update's
    for saved, want in zip(ovl[3], seq[3], strict=True):
        assert saved["version"] == want["version"]
        for index, entry in want["state"]["state"].items():
            for key, value in entry.items():
                assert torch.equal(saved["state"]["state"][index][key], value), (index, key)
    assert [m["version"] for m in ovl[3]] == [1, 2]
    # staleness was judged against the version the update was built on: the second update's
    # samples (served by version 0) were one version behind in both runs
    assert ovl[4][1].metrics["tokens"] == seq[4][1].metrics["tokens"]
    # a LoRA version's adapter config, as peft's save_pretrained writes it
    assert ovl[5] == seq[5] and len(ovl[5]) == (2 if lora_rank else 0)


def hold_records_until_the_next_update(trainer: OnlineTrainer) -> threading.Event:
    """Make the trainer's first record wait until its next update has run (the order a slow
    write or swap gives), and return the event that says it has."""
    update, record = trainer.policy.update, trainer.publisher.record
    done, updates = threading.Event(), []

    def counted_update(*args, **kwargs):
        metrics = update(*args, **kwargs)
        updates.append(1)
        if len(updates) == 2:
            done.set()
        return metrics

    def held_record(*args, **kwargs):
        assert done.wait(600), "the next update never ran"
        return record(*args, **kwargs)

    trainer.policy.update = counted_update
    trainer.publisher.record = held_record
    return done


def test_a_version_that_cannot_be_recorded_drops_the_update_built_on_it(
    make_database, tiny_model_dir: Path, tmp_path: Path, monkeypatch
) -> None:
    """Fault injected: version 1's commit finds its claim lost (as when its lease passed while
    the trainer was stopped). The update built on it meanwhile is dropped, its sessions go back
    to the queue, the trainer goes back to version 0's weights, and the next update trains from
    there as version 1."""
    trainer, engine, lines = trainer_on_fresh_database(make_database, tiny_model_dir, tmp_path)
    base = {k: v.clone() for k, v in state_dict(trainer.model).items()}
    record = trainer.publisher.record
    calls = []

    def lose_the_first_claim(parent, payload, kind, **kwargs):
        calls.append(parent)
        if len(calls) == 1:
            raise ClaimLost(["s-00"])
        return record(parent, payload, kind, **kwargs)

    monkeypatch.setattr(trainer.publisher, "record", lose_the_first_claim)
    try:
        assert trainer.advance() is None  # version 1 launched; its commit will fail
        assert trainer.advance() is None  # version 2's update is computed, then dropped
        assert trainer.inflight is None and trainer.version == 0
        for name, tensor in base.items():
            assert torch.equal(state_dict(trainer.model)[name], tensor), name
        assert versions(engine) == []
        with Session(engine) as db:
            held = db.scalars(
                select(AgentSession.id).where(AgentSession.claimed_by.is_not(None))
            ).all()
        assert held == ["s-00"]  # the lost one stays with its lease; the rest are back
        assert any("update dropped" in line for line in lines), lines
        trainer.advance()  # trains again, from version 0
        report = trainer.finish()
    finally:
        trainer.close()
    assert report is not None and report.version == 1 and versions(engine)[0][1] == 0
    assert calls[-1] == 0  # recorded on version 0
    engine.dispose()


@pytest.mark.parametrize("placement", ["colocated"])
def test_no_overlap_where_generation_is_paused_for_updates(
    make_database, tiny_model_dir: Path, tmp_path: Path, placement: str
) -> None:
    from rlgw.placement import Placement

    trainer, engine, _ = trainer_on_fresh_database(make_database, tiny_model_dir, tmp_path)
    trainer.placement = Placement(kind=placement)
    try:
        assert not trainer._overlaps()
        report = trainer.advance()  # published before it returns
        assert report is not None and report.version == 1 and trainer.inflight is None
    finally:
        trainer.close()
    engine.dispose()


def test_a_version_s_step_time_ends_when_it_is_served_not_when_the_next_update_ends(
    make_database, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Version 1 is pushed while version 2's update runs (made 2 s slower here); version 1's
    `step_s` runs from its claim to its push's return, without the rest of that update."""
    trainer, engine, _ = trainer_on_fresh_database(make_database, tiny_model_dir, tmp_path)
    update, push, launch = trainer.policy.update, trainer.publisher.push, trainer._launch
    claimed, served, updates = [], [], []

    def slow_second_update(*args, **kwargs):
        metrics = update(*args, **kwargs)
        updates.append(1)
        if len(updates) == 2:
            time.sleep(2.0)
        return metrics

    def timed_push(*args, **kwargs):
        swaps = push(*args, **kwargs)
        served.append(time.perf_counter())
        return swaps

    def noted_launch(pending):
        claimed.append(pending.started)
        launch(pending)

    trainer.policy.update, trainer.publisher.push = slow_second_update, timed_push
    trainer._launch = noted_launch
    try:
        assert trainer.advance() is None
        first = trainer.advance()  # collected after version 2's slow update
        trainer.finish()
    finally:
        trainer.close()
    assert first is not None and first.version == 1
    # (the old reading, at collection, would hold the 2 s of the next update and more)
    assert first.metrics["step_s"] == pytest.approx(served[0] - claimed[0], abs=0.05)
    engine.dispose()
