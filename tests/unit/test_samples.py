"""Training samples: which steps become samples, and the advantage each one carries."""

from __future__ import annotations

from datetime import UTC, datetime

from rlgw.trajectory import SiblingGroupOut, Step, Trajectory
from trainer.config import TrainerConfig
from trainer.samples import build_samples

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def step(completion_id: str, version: int = 0, sibling_group: str | None = None) -> Step:
    return Step(
        completion_id=completion_id,
        parent_id=None,
        api="chat.completions",
        policy_version=version,
        prompt_token_ids=[1, 2, 3],
        output_token_ids=[4, 5],
        output_logprobs=[-0.5, -0.25],
        finish_reason="stop",
        sibling_group=sibling_group,
        ineligible_reasons=[],
        rewards=[],
        reward_raw=None,
        response=None,
        created_at=T0,
    )


def trajectory(steps: list[Step], **fields) -> Trajectory:
    defaults = dict(
        session_id="s",
        group_id=None,
        task_id=None,
        status="closed",
        train=True,
        metadata={},
        group=None,
        return_raw=1.0,
        return_normalized=1.0,
        steps=steps,
        excluded=[],
    )
    return Trajectory(**{**defaults, **fields})


def siblings(status: str, normalized: dict[str, float]) -> SiblingGroupOut:
    return SiblingGroupOut(
        id="c1",
        completion_ids=["c1", "c1-1", "c1-2"],
        status=status,
        returns={k: 0.0 for k in normalized},
        normalized=normalized,
    )


def advantages(samples) -> dict[str, float]:
    return {s.completion_id: s.advantage for s in samples}


def test_every_step_of_a_session_takes_its_normalized_return():
    t = trajectory([step("a"), step("b")], return_raw=3.0, return_normalized=0.7)
    samples, skips = build_samples([t], current_version=0, config=TrainerConfig())
    assert advantages(samples) == {"a": 0.7, "b": 0.7} and skips == []


def test_sibling_choices_take_their_rewards_normalized_within_the_sibling_group():
    normalized = {"c1": 1.2, "c1-1": -0.2, "c1-2": -1.0}
    steps = [step("first"), *(step(c, sibling_group="c1") for c in normalized)]
    t = trajectory(steps, return_normalized=0.5, sibling_groups=[siblings("ready", normalized)])
    samples, skips = build_samples([t], current_version=0, config=TrainerConfig())
    assert advantages(samples) == {"first": 0.5, **normalized} and skips == []


def test_siblings_of_a_pending_group_are_skipped_with_the_reason():
    steps = [step("first"), *(step(c, sibling_group="c1") for c in ("c1", "c1-1", "c1-2"))]
    t = trajectory(steps, sibling_groups=[siblings("pending", {})])
    samples, skips = build_samples([t], current_version=0, config=TrainerConfig())
    assert advantages(samples) == {"first": 1.0}
    assert {s.completion_id for s in skips} == {"c1", "c1-1", "c1-2"}
    assert all("sibling group is pending" in s.reason for s in skips)


def test_with_sibling_normalization_none_siblings_are_ordinary_steps():
    steps = [step(c, sibling_group="c1") for c in ("c1", "c1-1", "c1-2")]
    t = trajectory(
        steps,
        return_normalized=0.3,
        sibling_normalization="none",
        sibling_groups=[siblings("pending", {})],
    )
    samples, _ = build_samples([t], current_version=0, config=TrainerConfig())
    assert advantages(samples) == {"c1": 0.3, "c1-1": 0.3, "c1-2": 0.3}


def test_stale_and_unreturned_steps_are_skipped_with_reasons():
    config = TrainerConfig(max_staleness=2)
    fresh, stale = step("fresh", version=8), step("stale", version=5)
    samples, skips = build_samples([trajectory([fresh, stale])], current_version=8, config=config)
    assert advantages(samples) == {"fresh": 1.0}
    assert [(s.completion_id, s.reason.split(":")[0]) for s in skips] == [("stale", "stale")]
    unreturned = trajectory([step("x")], return_raw=None, return_normalized=None)
    samples, skips = build_samples([unreturned], current_version=0, config=config)
    assert samples == [] and skips[0].reason == "the session has no normalized return"
