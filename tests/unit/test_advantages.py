"""The trainer's baselines against float64 references written independently, and the sessions
dropped before the update (non-finite advantages, zero-variance groups)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import pytest

from trainer.config import TrainerConfig
from trainer.loop.advantages import NON_FINITE, ZERO_VARIANCE, session_advantages


@dataclass
class Group:
    status: str = "ready"


@dataclass
class T:
    session_id: str
    return_raw: float | None
    return_normalized: float | None = None
    group_id: str | None = None
    task_id: str | None = None
    group: Group | None = None

    def __post_init__(self) -> None:
        if self.group_id is None and self.return_normalized is None:
            self.return_normalized = self.return_raw  # a session without a group: its raw return
        if self.group_id is not None and self.group is None:
            self.group = Group()


def exact_rloo(returns: list[float]) -> list[float]:
    """A_i = R_i - (sum_j R_j - R_i) / (n - 1), in exact rational arithmetic."""
    exact = [Fraction(r) for r in returns]
    total, n = sum(exact), len(exact)
    return [float(r - (total - r) / (n - 1)) for r in exact]


@pytest.mark.parametrize(
    "returns", [[1.0, 0.0, 0.5, 1.0], [0.3, 0.7], [1e308, 1e308, 0.0], [2.5, -1.0, 0.25]]
)
def test_rloo_is_each_return_minus_the_mean_of_the_others(returns):
    batch = [T(f"s{i}", r, 0.0, group_id="g") for i, r in enumerate(returns)]
    got = session_advantages(batch, TrainerConfig(baseline="rloo"))
    assert [got.of[f"s{i}"] for i in range(len(returns))] == pytest.approx(
        exact_rloo(returns), rel=1e-12
    )
    assert not got.dropped


def test_the_group_baseline_keeps_the_groups_own_normalization():
    batch = [T("a", 1.0, 0.9, group_id="g"), T("b", 0.0, -0.9, group_id="g")]
    assert session_advantages(batch, TrainerConfig()).of == {"a": 0.9, "b": -0.9}


def test_a_pending_group_has_no_advantage_under_any_baseline():
    batch = [T("a", 1.0, None, group_id="g"), T("b", None, None, group_id="g")]
    assert session_advantages(batch, TrainerConfig(baseline="rloo")).of == {"a": None, "b": None}


def test_singletons_keep_their_raw_reward_by_default():
    batch = [T("a", 0.75), T("b", 0.25)]
    assert session_advantages(batch, TrainerConfig()).of == {"a": 0.75, "b": 0.25}


def test_batch_mean_subtracts_the_mean_of_the_batchs_singletons_only():
    batch = [T("a", 0.75), T("b", 0.25), T("c", 0.2), T("g1", 5.0, 1.0, group_id="g")]
    got = session_advantages(batch, TrainerConfig(singleton_baseline="batch_mean")).of
    mean = float(sum(Fraction(x) for x in (0.75, 0.25, 0.2)) / 3)
    assert got["a"] == pytest.approx(0.75 - mean, rel=1e-15)
    assert got["c"] == pytest.approx(0.2 - mean, rel=1e-15)
    assert got["g1"] == 1.0  # a group keeps its own baseline


def test_task_mean_subtracts_the_tasks_earlier_mean_and_a_new_task_keeps_its_reward():
    batch = [T("a", 1.0, task_id="add"), T("b", 0.0, task_id="new"), T("c", 0.5)]
    config = TrainerConfig(singleton_baseline="task_mean")
    got = session_advantages(batch, config, {"add": 0.25}).of
    assert got == {"a": 0.75, "b": 0.0, "c": 0.5}


def test_zero_variance_groups_are_dropped_only_when_filtered():
    batch = [T("a", 1.0, 0.0, group_id="same"), T("b", 1.0, 0.0, group_id="same")]
    batch += [T("c", 1.0, 1.0, group_id="mixed"), T("d", 0.0, -1.0, group_id="mixed")]
    kept = session_advantages(batch, TrainerConfig())
    assert kept.of["a"] == 0.0 and not kept.dropped
    filtered = session_advantages(batch, TrainerConfig(filter_zero_variance=True))
    assert set(filtered.dropped) == {"a", "b"}
    assert filtered.dropped["a"].startswith(ZERO_VARIANCE)
    assert filtered.of == {"a": None, "b": None, "c": 1.0, "d": -1.0}


def test_a_non_finite_advantage_drops_its_session_with_the_reason():
    batch = [T("a", math.inf), T("b", 0.5), T("g1", 1.0, math.nan, group_id="g")]
    got = session_advantages(batch, TrainerConfig())
    assert set(got.dropped) == {"a", "g1"}
    assert all(r.startswith(NON_FINITE) for r in got.dropped.values())
    assert got.of == {"a": None, "b": 0.5, "g1": None}


def test_an_rloo_difference_beyond_the_float_range_is_dropped_not_trained():
    batch = [T("a", 1.7e308, 0.0, group_id="g"), T("b", -1.7e308, 0.0, group_id="g")]
    got = session_advantages(batch, TrainerConfig(baseline="rloo"))
    assert set(got.dropped) == {"a", "b"}


def test_infinite_returns_of_both_signs_in_a_batch_mean_drop_every_singleton():
    batch = [T("a", math.inf), T("b", -math.inf), T("c", 0.5)]
    got = session_advantages(batch, TrainerConfig(singleton_baseline="batch_mean"))
    assert set(got.dropped) == {"a", "b", "c"}  # the batch's mean is NaN: no baseline for any
