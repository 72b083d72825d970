"""A turn a weight swap continued on new weights, through samples, batch, update and export."""

from __future__ import annotations

import copy
import random

import pytest
import torch
from test_samples import step, trajectory
from update_fixtures import PAD_ID, assert_same_update, tiny_model, weights

from trainer.config import TrainerConfig
from trainer.loop.records import trajectory_from_export
from trainer.loop.samples import build_samples, collate
from trainer.loop.update import policy_update
from trainer.models.byte_model import VOCAB_SIZE

RTOL = 2e-6  # as tests/unit/test_update.py: the same gradient summed over other shapes
CONFIG = TrainerConfig(max_staleness=2, max_tokens_per_sample=256, grad_clip=1e9)
CURRENT = 7
OLD, NEW = 3, 7  # 3 is 4 behind 7: too stale under max_staleness 2


def crossed(n_old: int = 3, n_new: int = 5, seed: int = 0):
    """One answer whose first `n_old` tokens were sampled at OLD, the rest at NEW."""
    rng = random.Random(seed)
    prompt = [rng.randrange(VOCAB_SIZE) for _ in range(6)]
    output = [rng.randrange(VOCAB_SIZE) for _ in range(n_old + n_new)]
    return step("c").model_copy(
        update={
            "policy_version": OLD,
            "output_versions": [OLD] * n_old + [NEW] * n_new,
            "prompt_token_ids": prompt,
            "output_token_ids": output,
            "output_logprobs": [-5.5 + rng.uniform(-0.5, 0.5) for _ in output],
        }
    )


def samples_of(steps):
    samples, skips = build_samples([trajectory(steps)], current_version=CURRENT, config=CONFIG)
    return samples, skips


def test_a_crossed_turns_sample_carries_its_versions_and_token_mask():
    (sample,), skips = samples_of([crossed()])
    assert skips == []
    assert sample.version == OLD
    assert sample.output_versions == [OLD] * 3 + [NEW] * 5
    assert sample.loss_mask == [0] * 3 + [1] * 5
    assert sample.trained_tokens == 5 and sample.trained_versions() == [NEW] * 5


def test_a_turn_at_one_version_carries_no_per_token_arrays():
    plain = step("p", version=CURRENT).model_copy(update={"output_versions": [CURRENT] * 2})
    (sample,), _ = samples_of([plain])
    assert sample.output_versions is None and sample.loss_mask is None
    assert sample.trained_tokens == 2


def test_the_batch_masks_the_stale_tokens_and_holds_each_tokens_version():
    (sample,), _ = samples_of([crossed()])
    batch = collate([sample], PAD_ID)
    p = len(sample.prompt_ids)
    outputs = slice(p - 1, p - 1 + len(sample.output_ids))  # their target positions
    assert batch.mask[0, outputs].tolist() == [0.0] * 3 + [1.0] * 5
    assert batch.versions[0, outputs].tolist() == [OLD] * 3 + [NEW] * 5
    assert batch.advantages[0, outputs].tolist() == [0.0] * 3 + [1.0] * 5
    assert batch.behave[0, outputs].tolist() == pytest.approx(sample.behave_logprobs)


def test_masked_stale_tokens_give_the_update_of_the_fresh_tokens_alone():
    """Causal attention: the fresh tokens see the stale ones as history either way, so masking
    the stale ones equals moving them into the prompt."""
    turn = crossed()
    head = turn.output_token_ids[:3]
    fresh_only = turn.model_copy(
        update={
            "policy_version": NEW,
            "output_versions": None,
            "prompt_token_ids": turn.prompt_token_ids + head,
            "output_token_ids": turn.output_token_ids[3:],
            "output_logprobs": turn.output_logprobs[3:],
        }
    )
    base = tiny_model(2)
    before = weights(base)
    models = copy.deepcopy(base), copy.deepcopy(base)
    metrics = []
    for model, s in zip(models, (turn, fresh_only), strict=True):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        samples, _ = samples_of([s])
        metrics.append(policy_update(model, optimizer, samples, CONFIG, PAD_ID))
    assert_same_update(weights(models[0]), weights(models[1]), before, RTOL)
    masked, alone = metrics
    assert masked["tokens"] == alone["tokens"] == 5
    assert masked["fresh_tokens"] == 5 and masked["stale_tokens"] == 0
    for key in ("loss", "kl_behave"):
        assert masked[key] == pytest.approx(alone[key], rel=1e-5), key


def test_mixed_tokens_within_the_bound_split_into_fresh_and_stale_tokens():
    """Both versions within max_staleness: every token trains, and the KL metrics count the
    current version's tokens as fresh and the older one's as stale, token by token."""
    turn = crossed().model_copy(update={"output_versions": [CURRENT - 1] * 3 + [CURRENT] * 5})
    turn = turn.model_copy(update={"policy_version": CURRENT - 1})
    samples, _ = samples_of([turn])
    model = tiny_model(2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    metrics = policy_update(model, optimizer, samples, CONFIG, PAD_ID, current_version=CURRENT)
    assert metrics["tokens"] == 8
    assert metrics["fresh_tokens"] == 5 and metrics["stale_tokens"] == 3


def test_an_export_keeps_output_versions_and_an_older_export_still_loads():
    t = trajectory([crossed()])
    exported = t.model_dump(mode="json")
    loaded = trajectory_from_export(exported)
    assert loaded.steps[0].output_versions == [OLD] * 3 + [NEW] * 5
    assert build_samples([loaded], current_version=CURRENT, config=CONFIG) == samples_of(
        [crossed()]
    )
    del exported["steps"][0]["output_versions"]  # made before steps had it
    older = trajectory_from_export(exported)
    assert older.steps[0].output_versions is None
    samples, (skip,) = build_samples([older], current_version=CURRENT, config=CONFIG)
    assert samples == []  # every token at its policy_version, OLD: too stale
    assert skip.reason == "stale: generated by version 3, 4 behind (bound 2)"
