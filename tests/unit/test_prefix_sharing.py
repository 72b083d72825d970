"""Shared prefixes computed once give the padded path's log-probs, loss and update; a branch never
sees another; rows are joined only where they share a prefix short of every prompt's end, and
only where the saving outweighs the mask's attention."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch
from test_packing import (
    assert_update_equals_padded,
    family_model,
    mixed_samples,
    padded_logprobs,
)
from test_sequence_update import samples_of, session
from update_fixtures import PAD_ID, tiny_model

from trainer.config import TrainerConfig
from trainer.loop.packing import pack_units, prefix_sharing, shared_units
from trainer.loop.prefix_sharing import (
    attention_weight,
    saved_tokens,
    share_prefixes,
    tree_attention_mask,
)
from trainer.loop.samples import Sample, Unit, collate_units, row_tokens, sequence_rows
from trainer.loop.update import batch_logprobs, plan_update
from trainer.models.byte_model import VOCAB_SIZE

ATOL_LOGP = 1e-5


def grouped_samples(groups: int = 3, size: int = 4, seed: int = 11) -> list[Sample]:
    """`groups` prompts of 12-30 tokens, each answered `size` times (2-14 tokens): a group's
    samples share their whole prompt, as a task's samples do."""
    rng = random.Random(seed)
    samples = []
    for g in range(groups):
        prompt = [rng.randrange(VOCAB_SIZE) for _ in range(rng.randint(12, 30))]
        for k in range(size):
            output = [rng.randrange(VOCAB_SIZE) for _ in range(rng.randint(2, 14))]
            behave = [-5.5 + rng.uniform(-0.5, 0.5) for _ in output]
            advantage = rng.choice([-1.0, 1.0])
            samples.append(Sample("s", f"g{g}k{k}", prompt, output, behave, advantage, 0))
    return samples


def all_samples() -> list[Sample]:
    """Groups sharing prompts, the packing tests' mixed lengths (temperatures, top-k, a token
    mask, a four-turn training sequence), and a second session of the same conversation whose
    rows share its history."""
    twin = samples_of(session(temperatures=[1.0, 0.5, 1.0, 0.25]), join=True)
    twin = [
        dataclasses.replace(
            s, session_id="twin", completion_id=f"twin-{s.completion_id}", sequence="twin#0"
        )
        for s in twin
    ]
    twin[-1] = dataclasses.replace(twin[-1], output_ids=[7, 8, 9], behave_logprobs=[-5.0] * 3)
    return grouped_samples() + mixed_samples() + twin


def unit_logprobs(model, units: list[Unit]) -> dict[str, torch.Tensor]:
    """Each sample's log-probs at its output targets, read from batches of `units`."""
    out = {}
    for lines in pack_units(units, 4096):
        with torch.no_grad():
            logp = batch_logprobs(model, collate_units(lines, PAD_ID))
        for i, line in enumerate(lines):
            at = 0
            for unit in line:
                at += unit.shared
                for row in unit.rows:
                    start = at - unit.shared
                    for s in row:
                        p = start + len(s.prompt_ids)
                        out[s.completion_id] = logp[i, p - 1 : p - 1 + len(s.output_ids)]
                    at += len(row_tokens(row)) - unit.shared
    return out


@pytest.mark.parametrize("name", ["qwen2", "llama", "qwen3"])
def test_shared_prefixes_give_each_token_the_padded_log_prob(name: str) -> None:
    model, samples = family_model(name).eval(), all_samples()
    units = share_prefixes(sequence_rows(samples))
    assert saved_tokens(units) > 0 and any(len(u.rows) > 2 for u in units)
    shared, padded = unit_logprobs(model, units), padded_logprobs(model, samples)
    assert shared.keys() == padded.keys() == {s.completion_id for s in samples}
    for key, expected in padded.items():
        torch.testing.assert_close(shared[key], expected, atol=ATOL_LOGP, rtol=0, msg=key)


def test_eager_attention_takes_the_additive_mask() -> None:
    model, samples = family_model("llama").eval(), grouped_samples()
    model.config._attn_implementation = "eager"
    units = share_prefixes(sequence_rows(samples))
    shared, padded = unit_logprobs(model, units), padded_logprobs(model, samples)
    for key, expected in padded.items():
        torch.testing.assert_close(shared[key], expected, atol=ATOL_LOGP, rtol=0, msg=key)


def test_a_branch_does_not_see_its_siblings() -> None:
    """Changing one row's own tokens leaves the log-probs of the rows beside it in its unit as
    they were, and changes its own."""
    model, samples = tiny_model().eval(), grouped_samples(groups=1, size=4)
    (unit,) = share_prefixes(sequence_rows(samples))
    assert unit.shared == len(samples[0].prompt_ids) - 1
    first = unit.rows[0][0]
    changed = dataclasses.replace(first, output_ids=[(t + 1) % 256 for t in first.output_ids])
    before = unit_logprobs(model, [unit])
    after = unit_logprobs(model, [Unit([[changed]] + unit.rows[1:], unit.shared)])
    assert not torch.equal(before[first.completion_id], after[first.completion_id])
    for row in unit.rows[1:]:
        key = row[0].completion_id
        torch.testing.assert_close(after[key], before[key], atol=0, rtol=0)


@pytest.mark.parametrize(
    "objective",
    [
        {},
        {"imp_weight_mode": "mask", "imp_weight_level": "sequence", "imp_weight_floor": 0.995},
    ],
    ids=["token", "sequence-mask"],
)
def test_the_shared_update_equals_the_padded_update(objective: dict) -> None:
    """Loss, metrics and (SGD, no clipping: the step is the gradient) weights; the gradient
    through a shared prefix is the sum of what each of its rows sends it."""
    samples = all_samples()
    assert saved_tokens(shared_units(samples, 4096, attention_weight(tiny_model().config))) > 0
    assert_update_equals_padded(samples, 4096, objective)


def test_the_plan_computes_a_group_prompt_once() -> None:
    samples, cpu = grouped_samples(groups=2, size=8), torch.device("cpu")
    cfg = TrainerConfig(max_tokens_per_sample=512, max_tokens_per_microbatch=512)
    alpha = attention_weight(tiny_model().config)
    shared = plan_update(samples, cfg, PAD_ID, cpu, packed=True, share=alpha).microbatches[0]
    packed = plan_update(samples, cfg, PAD_ID, cpu, packed=True).microbatches[0]
    real = sum(int(b.attention.sum()) for b in shared)
    prompts = {tuple(s.prompt_ids): len(s.prompt_ids) for s in samples}
    # each group's prompt once (less the one token each branch keeps), then every answer
    expected = sum(len(s.output_ids) + 1 for s in samples) + sum(n - 1 for n in prompts.values())
    assert real == expected
    assert real < sum(int(b.attention.sum()) for b in packed)
    assert all(b.units is not None for b in shared) and all(b.units is None for b in packed)


def test_rows_are_joined_only_over_a_common_prefix_short_of_every_prompt() -> None:
    samples = all_samples()
    rows = sequence_rows(samples)
    units = share_prefixes(rows)
    kept = sorted(s.completion_id for u in units for row in u.rows for s in row)
    assert kept == sorted(s.completion_id for s in samples)  # every row once
    for unit in units:
        if len(unit.rows) == 1:
            continue
        first = row_tokens(unit.rows[0])
        for row in unit.rows:
            assert row_tokens(row)[: unit.shared] == first[: unit.shared]
            assert unit.shared < len(row[0].prompt_ids)  # a prompt token stays in each branch
    # the two sessions of one conversation share their history, never an answer of its
    twins = [u for u in units if any(s.completion_id.startswith("twin") for r in u.rows for s in r)]
    assert len(twins) == 1 and len(twins[0].rows) == 2


def test_the_mask_cost_keeps_wide_units_apart() -> None:
    """A short common prompt before long answers: one unit would save 3 tokens a row but attend
    densely over 800, so the rows stay apart; counting tokens alone (alpha 0) joins them."""
    prompt = [1, 2, 3, 4]
    rows = [[Sample("s", f"c{k}", prompt, [k + 5] * 100, [-1.0] * 100, 1.0, 0)] for k in range(8)]
    assert [len(u.rows) for u in share_prefixes(rows)] == [1] * 8
    (joined,) = share_prefixes(rows, alpha=0.0)
    assert len(joined.rows) == 8 and joined.shared == 3


def test_a_unit_over_the_budget_is_split_back_into_rows() -> None:
    samples = grouped_samples(groups=1, size=8)
    longest = max(len(row_tokens(r)) for r in sequence_rows(samples))
    units = shared_units(samples, longest + 5, 3e-4)
    assert len(units) == len(samples) and all(u.shared == 0 for u in units)


def test_the_mask_lets_a_branch_see_the_prefix_and_itself() -> None:
    units = torch.tensor([[0, 0, 0, 0, 0, 1]])  # a prefix of 2, branches of 2 and 2, padding
    branches = torch.tensor([[-1, -1, 4, 5, 5, -1]])
    allowed = tree_attention_mask(units, branches)[0, 0]
    assert allowed[2].tolist() == [True, True, True, False, False, False]
    assert allowed[4].tolist() == [True, True, False, True, True, False]  # not branch 4
    assert allowed[5].tolist() == [False] * 5 + [True]  # padding: itself only
    additive = tree_attention_mask(units, branches, torch.float32)[0, 0]
    assert torch.equal(additive == 0, allowed)


def test_prefixes_are_shared_where_the_model_and_the_config_allow() -> None:
    model = tiny_model()
    assert prefix_sharing(TrainerConfig(), model) == pytest.approx(attention_weight(model.config))
    assert prefix_sharing(TrainerConfig(share_prefixes=False), model) is None
    assert prefix_sharing(TrainerConfig(packing="off"), model) is None
    model.config._attn_implementation = "flash_attention_2"  # no 4D masks
    assert prefix_sharing(TrainerConfig(), model) is None
