"""A session's turns as training sequences: joined while each prompt extends the last, cut with a
named reason where the record shows it does not (rlgw/sequences.py)."""

from __future__ import annotations

from test_samples import step, trajectory

from rlgw.sequences import build_sequences, left_out, trainable
from trainer.config import TrainerConfig

CONFIG = TrainerConfig()
SYSTEM = [100, 101, 102]  # template tokens before the first user turn


def turn(cid: str, prompt: list[int], output: list[int], **fields):
    s = step(cid, **{k: fields.pop(k) for k in ("version", "sibling_group") if k in fields})
    return s.model_copy(
        update={
            "prompt_token_ids": prompt,
            "output_token_ids": output,
            "output_logprobs": [-0.5] * len(output),
            **fields,
        }
    )


def conversation(outputs: list[list[int]], between: list[list[int]]) -> list:
    """Turns whose prompts are the history so far: SYSTEM, then for each turn the tokens
    `between` (user turn, tool result, template) and the previous outputs."""
    turns, history = [], list(SYSTEM)
    for i, (out, ctx) in enumerate(zip(outputs, between, strict=True)):
        history = history + ctx
        turns.append(turn(f"t{i}", list(history), out))
        history = history + out
    return turns


def sequences(steps, **kw):
    return build_sequences(trajectory(steps), current_version=0, limits=CONFIG, **kw)


def test_turns_that_extend_each_other_are_one_sequence_with_loss_on_the_outputs_only():
    outputs = [[10, 11], [20, 21, 22], [30]]
    between = [[1, 2], [3, 4, 5], [6]]
    steps = conversation(outputs, between)
    (seq,) = sequences(steps)
    assert seq.token_ids == steps[-1].prompt_token_ids + [30]
    assert seq.cuts == []
    view = seq.per_token()
    trained = [tok for tok, m in zip(seq.token_ids, view["loss_mask"], strict=True) if m]
    assert trained == [10, 11, 20, 21, 22, 30]
    assert [(t.start, t.end) for t in seq.turns] == [(5, 7), (10, 13), (14, 15)]
    assert view["logprobs"][:5] == [None] * 5 and view["logprobs"][5] == -0.5
    assert view["advantages"][4:8] == [0.0, 1.0, 1.0, 0.0]


def test_per_turn_mode_keeps_one_sequence_per_turn():
    steps = conversation([[10], [20], [30]], [[1], [2], [3]])
    seqs = sequences(steps, join_turns=False)
    assert [s.token_ids for s in seqs] == [s.prompt_token_ids + s.output_token_ids for s in steps]
    assert all(s.cuts == [] for s in seqs)


def test_sibling_choices_branch_and_the_next_turn_follows_the_choice_it_extends():
    prompt = SYSTEM + [1, 2]
    a = turn("a", prompt, [10, 11], sibling_group="a")
    b = turn("b", prompt, [12, 13], sibling_group="a")
    after_b = turn("c", prompt + [12, 13, 3], [14])
    seqs = sequences([a, b, after_b])
    assert [[t.step.completion_id for t in s.turns] for s in seqs] == [["a"], ["b", "c"]]
    assert [(c.at, c.reason) for c in seqs[1].cuts] == [("b", "branch")]


def test_an_earlier_answer_rendered_differently_cuts_as_output_retokenized():
    first = turn("t0", SYSTEM + [1, 2], [10, 11, 12])  # e.g. <think>...</think> answer
    # the template dropped the reasoning: the history holds the answer's last token only
    second = turn("t1", SYSTEM + [1, 2, 12, 3], [20])
    seqs = sequences([first, second])
    assert len(seqs) == 2
    (cut,) = seqs[1].cuts
    assert (cut.at, cut.reason) == ("t1", "output_retokenized")
    assert "inside t0's output" in cut.detail


def test_an_edited_history_cuts_as_history_edited():
    first = turn("t0", SYSTEM + [1, 2], [10])
    second = turn("t1", SYSTEM + [1, 9, 10, 3], [20])  # the user turn was edited
    shortened = turn("t2", SYSTEM + [1], [30])  # a history cut short inside its context
    seqs = sequences([first, second, shortened])
    assert [c.reason for s in seqs for c in s.cuts] == ["history_edited", "history_edited"]


def test_an_ineligible_turn_stays_as_context_and_the_next_turn_still_extends_it():
    steps = conversation([[10], [20], [30]], [[1], [2], [3]])
    steps[1] = steps[1].model_copy(update={"ineligible_reasons": ["crossed a weight swap"]})
    (seq,) = sequences(steps)
    assert [t.trained for t in seq.turns] == [True, False, True]
    assert "crossed a weight swap" in seq.turns[1].verdict.reason
    trained = [tok for tok, m in zip(seq.token_ids, seq.per_token()["loss_mask"], strict=True) if m]
    assert trained == [10, 30]


def test_a_turn_over_the_cap_is_left_out_with_its_reason_and_earlier_turns_still_train():
    steps = conversation([[10] * 4, [20] * 4], [[1] * 4, [2] * 4])
    config = TrainerConfig(max_tokens_per_sample=12, max_tokens_per_microbatch=12)
    seqs = build_sequences(trajectory(steps), current_version=0, limits=config)
    (kept,) = trainable(seqs)
    assert [t.step.completion_id for t in kept.turns] == ["t0"]
    (out,) = left_out(seqs)
    assert out.step.completion_id == "t1" and out.verdict.reason == "longer than 12 tokens"


def test_another_models_turns_are_neither_trained_nor_cut_on():
    planner = turn("p", SYSTEM + [1], [10], model="planner")
    worker = turn("w", SYSTEM + [1, 10, 2], [20], model="worker")
    planner2 = turn("p2", SYSTEM + [1, 10, 2, 20, 3], [30], model="planner")
    (seq,) = sequences([planner, worker, planner2], model="planner")
    assert [t.step.completion_id for t in seq.turns] == ["p", "p2"]
    assert seq.per_token()["loss_mask"].count(1) == 2  # the worker's 20 is context


# ------------------------------------------------------------------- per-token versions
# A weight swap paused a request in place and continued it on new weights: the first tokens of
# its output were sampled at one version, the rest at another (`output_versions`).


def test_a_turn_continued_by_a_swap_has_each_tokens_version_in_the_sequence():
    steps = conversation([[10, 11], [20, 21, 22]], [[1], [2]])
    steps[1] = steps[1].model_copy(update={"policy_version": 0, "output_versions": [0, 1, 1]})
    (seq,) = build_sequences(trajectory(steps), current_version=1, limits=CONFIG)
    view = seq.per_token()
    assert view["versions"] == [None] * 4 + [0, 0] + [None] + [0, 1, 1]
    assert view["loss_mask"] == [0] * 4 + [1, 1] + [0] + [1, 1, 1]


def test_a_step_without_output_versions_has_every_token_at_its_policy_version():
    (seq,) = sequences([turn("t0", SYSTEM, [10, 11, 12], version=0)])
    assert seq.per_token()["versions"] == [None] * 3 + [0, 0, 0]


def test_tokens_too_stale_carry_no_loss_and_the_rest_of_the_turn_trains():
    limits = TrainerConfig(max_staleness=2)
    crossed = turn("t0", SYSTEM, [10, 11, 12, 13], version=1, output_versions=[1, 1, 4, 4])
    (seq,) = build_sequences(trajectory([crossed]), current_version=5, limits=limits)
    (t,) = seq.turns
    assert t.trained and t.verdict.reason is None
    view = seq.per_token()
    assert view["loss_mask"] == [0] * 3 + [0, 0, 1, 1]
    assert view["advantages"] == [0.0] * 3 + [0.0, 0.0, 1.0, 1.0]
    assert view["logprobs"][3:] == [-0.5] * 4  # the recorded log-probs stay, trained or not
    assert t.verdict.masked_reason == (
        "2 of 4 output tokens carry no loss: stale: generated by version 1, 4 behind (bound 2)"
    )


def test_tokens_off_the_lineage_carry_no_loss():
    # version 2 was rolled back: current 3 descends from 1
    depths = {3: 0, 1: 1, 0: 2}
    crossed = turn("t0", SYSTEM, [10, 11, 12], version=1, output_versions=[1, 2, 2])
    (seq,) = sequences([crossed], lineage=depths)
    assert seq.per_token()["loss_mask"][3:] == [1, 0, 0]
    assert "generated by version 2, which is not an ancestor" in seq.turns[0].verdict.masked_reason


def test_a_turn_with_every_token_too_stale_is_context_with_its_versions_reasons():
    limits = TrainerConfig(max_staleness=1)
    crossed = turn("t0", SYSTEM, [10, 11, 12], version=1, output_versions=[1, 2, 2])
    later = turn("t1", SYSTEM + [10, 11, 12, 5], [20], version=5)
    seqs = build_sequences(trajectory([crossed, later]), current_version=5, limits=limits)
    (seq,) = seqs  # the stale turn stays as context: the later turn still extends it
    stale, fresh = seq.turns
    assert not stale.trained and fresh.trained
    assert stale.verdict.reason == (
        "stale: generated by version 1, 4 behind (bound 1); "
        "stale: generated by version 2, 3 behind (bound 1)"
    )
    assert seq.per_token()["loss_mask"] == [0] * 7 + [1]


def test_a_turn_at_one_stale_version_keeps_todays_reason():
    limits = TrainerConfig(max_staleness=1)
    old = turn("t0", SYSTEM, [10, 11], version=1, output_versions=[1, 1])
    (seq,) = build_sequences(trajectory([old]), current_version=5, limits=limits)
    assert seq.turns[0].verdict.reason == "stale: generated by version 1, 4 behind (bound 1)"


def test_output_versions_of_the_wrong_length_make_the_turn_context_with_a_reason():
    broken = turn("t0", SYSTEM, [10, 11, 12], version=0, output_versions=[0, 0])
    (seq,) = sequences([broken])
    assert seq.turns[0].verdict.reason == (
        "its output_versions holds 2 versions for 3 output tokens"
    )
    view = seq.per_token()
    assert view["versions"][3:] == [None] * 3 and view["loss_mask"] == [0] * 6
