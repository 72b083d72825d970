"""The cuts a version's metrics record (`metrics["cuts"]`): counted over the sequences that
build_samples builds from the same trajectories and arguments."""

from __future__ import annotations

from datetime import UTC, datetime

from rlgw.trajectory import Step, Trajectory
from trainer.config import TrainerConfig
from trainer.loop.samples import build_samples, cut_counts

T0 = datetime(2026, 1, 1, tzinfo=UTC)
# SmolLM2's template: <|im_start|> 1, <|im_end|> 2, newline 198; user 4093, assistant 520
PROMPT = [1, 4093, 198, 1780, 314, 216, 34, 2, 198, 1, 520, 198]
OUTPUT = [504, 3575, 314, 216, 36, 2]
FOLLOW_UP = [198, 1, 4093, 198, 9286, 2, 198, 1, 520, 198]


def step(cid: str, prompt: list[int], output: list[int]) -> Step:
    return Step(
        completion_id=cid,
        parent_id=None,
        api="chat.completions",
        policy_version=0,
        prompt_token_ids=prompt,
        output_token_ids=output,
        output_logprobs=[-0.5] * len(output),
        finish_reason="stop",
        ineligible_reasons=[],
        rewards=[],
        reward_raw=None,
        response=None,
        created_at=T0,
    )


def session() -> Trajectory:
    """A first turn, then one turn of each cut: a regeneration from the same history (branch),
    the history with a word of it edited, the first answer re-tokenized."""
    edited = [*PROMPT[:4], 11343, *PROMPT[5:]]
    retokenized = [504, 3575, 314, 216, 1232, 36, 2]
    steps = [
        step("first", PROMPT, OUTPUT),
        step("again", PROMPT, [1319, 2]),
        step("edited", edited + OUTPUT + FOLLOW_UP, [7576, 2]),
        step("rerendered", PROMPT + retokenized + FOLLOW_UP, [13359, 2]),
    ]
    return Trajectory(
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


def test_each_cut_reason_is_counted_once_per_sequence_it_begins():
    counts = cut_counts([session()], current_version=0, config=TrainerConfig())
    assert counts == {"branch": 1, "output_retokenized": 1, "history_edited": 1}
    samples, _ = build_samples([session()], current_version=0, config=TrainerConfig())
    assert len(samples) == 4  # every turn trains, each in a sequence of its own: 3 of them cut


def test_a_reason_without_cuts_is_zero_and_unjoined_turns_are_never_cut():
    plain = session()
    plain.steps = plain.steps[:1]
    assert cut_counts([plain], current_version=0, config=TrainerConfig()) == {
        "branch": 0,
        "output_retokenized": 0,
        "history_edited": 0,
    }
    unjoined = cut_counts([session()], current_version=0, config=TrainerConfig(join_turns=False))
    assert set(unjoined.values()) == {0}


def test_a_turn_left_out_begins_no_sequence_and_is_not_counted():
    """With the vocabulary given, a turn whose ids the model cannot embed is left out of every
    sequence (as build_samples leaves it out): its cut is not counted."""
    t = session()
    t.steps[1] = step("again", PROMPT, [1319, 60000])  # beyond a 49152-id vocabulary
    counts = cut_counts([t], current_version=0, config=TrainerConfig(), vocab_size=49152)
    assert counts == {"branch": 0, "output_retokenized": 1, "history_edited": 1}
    _, skips = build_samples([t], current_version=0, config=TrainerConfig(), vocab_size=49152)
    assert [s.completion_id for s in skips] == ["again"]
