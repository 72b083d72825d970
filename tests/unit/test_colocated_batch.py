"""A colocated update (generation paused while it trains) waits for a full batch, for at most
RLGW_COLOCATED_BATCH_WAIT_S; the other placements update from `min_sessions`."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rlgw.placement import Placement
from trainer.config import TrainerConfig
from trainer.loop import service
from trainer.loop.service import OnlineTrainer


def trainer(kind: str, wait_s: float) -> SimpleNamespace:
    """The state `_batch_floor` reads, as an OnlineTrainer holds it."""
    return SimpleNamespace(
        placement=Placement(kind),
        config=TrainerConfig(batch_sessions=32, min_sessions=2),
        settings=SimpleNamespace(colocated_batch_wait_s=wait_s),
        _short_since=None,
    )


def test_a_colocated_update_waits_for_a_full_batch_until_the_wait_runs_out(monkeypatch) -> None:
    now = [100.0]
    monkeypatch.setattr(service.time, "monotonic", lambda: now[0])
    t = trainer("colocated", wait_s=60.0)
    assert OnlineTrainer._batch_floor(t) == 32  # the first short claim starts the clock
    now[0] = 159.0
    assert OnlineTrainer._batch_floor(t) == 32
    now[0] = 160.0
    assert OnlineTrainer._batch_floor(t) == 2  # waited long enough: what is eligible trains


@pytest.mark.parametrize("kind", ["shared", "separated"])
def test_placements_that_generate_beside_the_update_start_from_min_sessions(kind: str) -> None:
    t = trainer(kind, wait_s=60.0)
    if kind == "separated":
        t.placement = Placement.choose("separated", available=frozenset({0, 1}))
    assert OnlineTrainer._batch_floor(t) == 2
    assert t._short_since is None


def test_no_wait_makes_a_colocated_update_start_from_min_sessions() -> None:
    assert OnlineTrainer._batch_floor(trainer("colocated", wait_s=0.0)) == 2
