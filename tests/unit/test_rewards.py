"""Group normalization and group readiness."""

import math
from datetime import UTC, datetime, timedelta

import pytest

from rlgw.rewards import Member, judge_group, normalize_returns

NOW = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize("how", ["none", "mean", "mean_std"])
def test_a_group_of_one_keeps_its_raw_reward(how):
    assert normalize_returns({"a": 0.7}, how) == {"a": 0.7}


def test_mean_and_mean_std_of_two():
    assert normalize_returns({"a": 1.0, "b": 0.0}, "mean") == {"a": 0.5, "b": -0.5}
    got = normalize_returns({"a": 1.0, "b": 0.0}, "mean_std")
    assert got["a"] == pytest.approx(1.0, abs=1e-5) and got["b"] == pytest.approx(-1.0, abs=1e-5)


def test_mean_std_of_eight_has_zero_mean_unit_std():
    returns = {str(i): float(i % 3) for i in range(8)}
    got = list(normalize_returns(returns, "mean_std").values())
    mean = sum(got) / 8
    assert mean == pytest.approx(0.0, abs=1e-9)
    assert (sum((g - mean) ** 2 for g in got) / 8) ** 0.5 == pytest.approx(1.0, abs=1e-5)


def test_equal_rewards_normalize_to_zero_not_nan():
    assert normalize_returns({"a": 1.0, "b": 1.0}, "mean_std") == {"a": 0.0, "b": 0.0}


def members(n: int, rewarded: int) -> list[Member]:
    return [Member(str(i), True, [1.0] if i < rewarded else []) for i in range(n)]


def test_group_missing_a_reward_is_held_back_before_the_deadline():
    verdict = judge_group(
        members(8, 7), "mean", expected_size=None, deadline_at=NOW + timedelta(minutes=1), now=NOW
    )
    assert verdict.status == "pending" and verdict.normalized == {}


def test_group_missing_a_reward_is_dropped_after_the_deadline():
    verdict = judge_group(members(2, 1), "mean", expected_size=None, deadline_at=NOW, now=NOW)
    assert verdict.status == "dropped" and "1 of 2" in verdict.reason


def test_group_waits_for_its_expected_size():
    verdict = judge_group(
        members(2, 2), "mean", expected_size=3, deadline_at=NOW + timedelta(minutes=1), now=NOW
    )
    assert verdict.status == "pending" and "1 of 3" in verdict.reason


def test_complete_group_is_ready_and_normalized():
    verdict = judge_group(
        [Member("a", True, [1.0, 0.5]), Member("b", True, [0.0])],
        "mean",
        expected_size=2,
        deadline_at=NOW,
        now=NOW,
    )
    assert verdict.status == "ready"
    assert verdict.returns == {"a": 1.5, "b": 0.0}
    assert verdict.normalized == {"a": 0.75, "b": -0.75}


def exact_reference(returns: dict[str, float], how: str) -> dict[str, float]:
    """The normalization in 60-digit decimal arithmetic, where nothing overflows."""
    from decimal import Decimal, getcontext

    getcontext().prec = 60
    values = {k: Decimal(r) for k, r in returns.items()}
    mean = sum(values.values()) / len(values)
    if how == "mean":
        return {k: float(v - mean) for k, v in values.items()}
    std = (sum((v - mean) ** 2 for v in values.values()) / len(values)).sqrt()
    return {k: float((v - mean) / (std + Decimal("1e-6"))) for k, v in values.items()}


@pytest.mark.parametrize(
    "returns",
    [
        {"a": 1e308, "b": 1e308, "c": 0.0},
        {"a": -1.7e308, "b": 1.7e308},
        {"a": 1e-300, "b": 3e-300, "c": -2e-300},
        {"a": 0.25, "b": 1.0, "c": 0.0, "d": 0.5},
    ],
)
def test_mean_std_is_finite_and_exact_at_any_scale(returns):
    got = normalize_returns(returns, "mean_std")
    want = exact_reference(returns, "mean_std")
    assert all(math.isfinite(v) for v in got.values())
    assert got == pytest.approx(want, rel=1e-12, abs=1e-12)


def test_mean_overflows_only_where_the_true_difference_does():
    assert normalize_returns({"a": 1e308, "b": 1e308, "c": 0.0}, "mean") == pytest.approx(
        exact_reference({"a": 1e308, "b": 1e308, "c": 0.0}, "mean"), rel=1e-12
    )
    spread = normalize_returns({"a": -1.7e308, "b": 1.7e308}, "mean")  # the truth is +-1.7e308
    assert spread == pytest.approx({"a": -1.7e308, "b": 1.7e308}, rel=1e-12)


def test_a_non_finite_return_makes_the_group_nan():
    got = normalize_returns({"a": math.inf, "b": 0.0}, "mean_std")
    assert all(math.isnan(v) for v in got.values())
