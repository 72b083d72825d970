"""A multi-turn session trained as one sequence gives the update its turns give as separate
samples (causal attention: each output sees the same history either way), for fewer tokens."""

from __future__ import annotations

import copy
import random

import pytest
import torch
from test_samples import step, trajectory
from update_fixtures import PAD_ID, assert_same_update, tiny_model, weights

from trainer.config import TrainerConfig
from trainer.loop.microbatch import pack_microbatches
from trainer.loop.samples import build_samples, collate, row_tokens, sequence_rows
from trainer.loop.update import policy_update
from trainer.models.byte_model import VOCAB_SIZE

RTOL = 2e-6  # as tests/unit/test_update.py: the same gradient summed over other shapes


def session(turns: int = 4, seed: int = 0, temperatures=None) -> list:
    """A conversation of `turns` turns: each prompt is the history so far (template, user turn
    or tool result, earlier answers), each answer 3-8 tokens with log-probs near uniform."""
    rng = random.Random(seed)
    history = [rng.randrange(VOCAB_SIZE) for _ in range(5)]
    steps = []
    for i in range(turns):
        history = history + [rng.randrange(VOCAB_SIZE) for _ in range(rng.randint(2, 6))]
        output = [rng.randrange(VOCAB_SIZE) for _ in range(rng.randint(3, 8))]
        t = 1.0 if temperatures is None else temperatures[i]
        steps.append(
            step(f"t{i}").model_copy(
                update={
                    "prompt_token_ids": list(history),
                    "output_token_ids": output,
                    "output_logprobs": [-5.5 + rng.uniform(-0.5, 0.5) for _ in output],
                    "sampling": {"temperature": t, "top_p": 1.0, "top_k": -1, "min_p": 0.0},
                }
            )
        )
        history = history + output
    return steps


def samples_of(steps, join: bool, advantage: float = 1.0):
    config = TrainerConfig(join_turns=join, max_tokens_per_sample=256)
    t = trajectory(steps, return_normalized=advantage)
    samples, skips = build_samples([t], current_version=0, config=config)
    assert skips == []
    return samples


def update(model, samples):
    config = TrainerConfig(max_tokens_per_sample=256, grad_clip=1e9)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return policy_update(model, optimizer, samples, config, PAD_ID)


def test_the_turns_of_a_session_are_one_row_of_the_last_turns_tokens():
    steps = session()
    joined = samples_of(steps, join=True)
    assert [s.completion_id for s in joined] == ["t0", "t1", "t2", "t3"]
    (row,) = sequence_rows(joined)
    assert row_tokens(row) == steps[-1].prompt_token_ids + steps[-1].output_token_ids
    batch = collate(joined, PAD_ID)
    assert batch.inputs.shape[0] == 1
    trained = batch.targets[0][batch.mask[0].bool()].tolist()
    assert trained == [tok for s in steps for tok in s.output_token_ids]
    per_turn = samples_of(steps, join=False)
    assert all(s.sequence is None for s in per_turn) and len(sequence_rows(per_turn)) == 4
    assert batch.inputs.numel() < collate(per_turn, PAD_ID).attention.sum()


@pytest.mark.parametrize("temperatures", [None, [1.0, 0.5, 0.8, 1.0]])
def test_one_sequence_gives_the_update_of_its_turns_as_separate_samples(temperatures):
    """Plain SGD, clipping off (tests/unit/test_update.py says why); with each turn at its own
    temperature, the joined row scores each output at its own."""
    steps = session(temperatures=temperatures)
    base = tiny_model(2)
    before = weights(base)
    joined, separate = copy.deepcopy(base), copy.deepcopy(base)
    m_joined = update(joined, samples_of(steps, join=True))
    m_separate = update(separate, samples_of(steps, join=False))
    assert_same_update(weights(joined), weights(separate), before, RTOL)
    for key in ("loss", "kl_behave", "tokens"):
        assert m_joined[key] == pytest.approx(m_separate[key], rel=1e-5), key


def test_a_sequence_is_never_split_across_micro_batches_and_keeps_its_settings():
    a = samples_of(session(seed=1), join=True)
    b = samples_of(session(seed=2), join=True)
    b = [s.__class__(**{**s.__dict__, "session_id": "s2", "sequence": "s2#0"}) for s in b]
    longest = max(len(row_tokens(sequence_rows(x)[0])) for x in (a, b))
    groups = pack_microbatches(a + b, longest)  # room for one row each
    assert sorted(len(g) for g in groups) == [4, 4]
    assert all(len({s.sequence for s in g}) == 1 for g in groups)
    hot = collate(samples_of(session(temperatures=[1.0, 0.5, 1.0, 0.25]), join=True), PAD_ID)
    assert hot.sampling is not None
    temps = hot.sampling.temperature[0][hot.sampling.positions[0]].unique().tolist()
    assert sorted(temps) == [0.25, 0.5]
