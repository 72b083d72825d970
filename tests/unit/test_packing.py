"""Packed micro-batches give the padded path's log-probs, loss and update; packed rows never see
each other."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from test_sequence_update import samples_of, session
from update_fixtures import PAD_ID, assert_same_update, random_samples, tiny_model, weights

from trainer.config import TrainerConfig
from trainer.loop.loss import decoupled_ppo_loss
from trainer.loop.packing import pack_lines, padding_fraction, supports_packing, use_packing
from trainer.loop.samples import Sample, collate, collate_lines, row_tokens, sequence_rows
from trainer.loop.sampling_processing import SamplingSettings
from trainer.loop.update import batch_logprobs, plan_update, policy_update
from trainer.models.byte_model import ENDOFTEXT_ID, IM_END_ID, PRESETS, VOCAB_SIZE
from trainer.models.model_families import build_config, build_model, family

RTOL = 2e-6  # as tests/unit/test_update.py: the same gradient summed over other shapes
ATOL_LOGP = 1e-5  # per-token log-probs of one row computed in two layouts (measured ~2e-7)


def family_model(name: str, seed: int = 0) -> torch.nn.Module:
    """A tiny random model of a served family: the byte model (qwen2), or llama / qwen3 over the
    byte vocabulary."""
    if name == "qwen2":
        return tiny_model(seed)
    ids = {"bos": None, "eos": IM_END_ID, "pad": ENDOFTEXT_ID}
    fam = family(name)
    return build_model(fam, build_config(fam, PRESETS["tiny"], VOCAB_SIZE, ids), seed)


def mixed_samples() -> list[Sample]:
    """Agent-like lengths: a few long samples, many short ones, and a four-turn training
    sequence (one row) sampled at temperatures 0.5 and 0.25 in two turns; one sample at
    temperature 0.7 with top-k, one with a per-token loss mask."""
    long = random_samples(3, seed=5, max_len=64)
    short = [
        dataclasses.replace(s, completion_id=f"short{i}")
        for i, s in enumerate(random_samples(10, seed=6, max_len=26))
    ]
    samples = long + short
    samples[1] = dataclasses.replace(samples[1], sampling=SamplingSettings(0.7, top_k=20))
    n = len(samples[4].output_ids)
    samples[4] = dataclasses.replace(samples[4], loss_mask=[i % 2 for i in range(n)])
    return samples + samples_of(session(temperatures=[1.0, 0.5, 1.0, 0.25]), join=True)


def output_logprobs(lines, logp: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each sample's log-probs at its output targets, read from a batch of `lines`."""
    out = {}
    for i, line in enumerate(lines):
        at = 0
        for row in line:
            for s in row:
                p = at + len(s.prompt_ids)
                out[s.completion_id] = logp[i, p - 1 : p - 1 + len(s.output_ids)]
            at += len(row_tokens(row))
    return out


def packed_logprobs(model, samples, budget: int) -> dict[str, torch.Tensor]:
    out, groups = {}, pack_lines(samples, budget)
    assert any(len(line) > 1 for lines in groups for line in lines)  # rows do share lines
    for lines in groups:
        with torch.no_grad():
            out |= output_logprobs(lines, batch_logprobs(model, collate_lines(lines, PAD_ID)))
    return out


def padded_logprobs(model, samples) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        logp = batch_logprobs(model, collate(samples, PAD_ID))
    return output_logprobs([[row] for row in sequence_rows(samples)], logp)


@pytest.mark.parametrize("name", ["qwen2", "llama", "qwen3"])
def test_packed_lines_give_each_token_the_padded_log_prob(name: str) -> None:
    model, samples = family_model(name).eval(), mixed_samples()
    longest = max(len(row_tokens(r)) for r in sequence_rows(samples))
    packed = packed_logprobs(model, samples, 3 * longest)
    padded = padded_logprobs(model, samples)
    assert packed.keys() == padded.keys() == {s.completion_id for s in samples}
    for key, expected in padded.items():
        torch.testing.assert_close(packed[key], expected, atol=ATOL_LOGP, rtol=0, msg=key)


def test_a_packed_row_does_not_see_its_neighbours() -> None:
    """Changing the first row of a line leaves the log-probs of the rows after it as they were."""
    model, samples = tiny_model().eval(), random_samples(4, seed=1)
    lines = [[[s] for s in samples]]  # one line: four rows end to end
    first = samples[0]
    changed = dataclasses.replace(first, prompt_ids=[(t + 1) % 256 for t in first.prompt_ids])
    with torch.no_grad():
        before = output_logprobs(lines, batch_logprobs(model, collate_lines(lines, PAD_ID)))
        lines2 = [[[changed]] + lines[0][1:]]
        after = output_logprobs(lines2, batch_logprobs(model, collate_lines(lines2, PAD_ID)))
    assert not torch.equal(before[first.completion_id], after[first.completion_id])
    for s in samples[1:]:
        torch.testing.assert_close(after[s.completion_id], before[s.completion_id], atol=0, rtol=0)


@pytest.mark.parametrize(
    "objective",
    [
        {},
        {"imp_weight_mode": "mask", "imp_weight_level": "sequence", "imp_weight_floor": 0.995},
    ],
    ids=["token", "sequence-mask"],
)
def test_the_packed_update_equals_the_padded_update(objective: dict) -> None:
    """Loss, metrics and (SGD, no clipping: the step is the gradient) weights; the sequence-level
    mask judges each packed row by its own tokens."""
    samples = mixed_samples()
    budget = 3 * max(len(row_tokens(r)) for r in sequence_rows(samples))
    assert_update_equals_padded(samples, budget, objective)


def assert_update_equals_padded(samples: list[Sample], budget: int, objective: dict) -> None:
    """One SGD update of `samples` packed (prefixes shared where the default says so) and padded
    gives the same weights, loss and metrics."""
    base = tiny_model(2)
    before = weights(base)
    packed, padded = copy.deepcopy(base), copy.deepcopy(base)

    def run(model, packing: str) -> dict[str, float]:
        cfg = TrainerConfig(
            max_tokens_per_sample=budget,
            max_tokens_per_microbatch=budget,
            grad_clip=1e9,
            packing=packing,
            **objective,
        )
        return policy_update(model, torch.optim.SGD(model.parameters(), lr=0.1), samples, cfg, 0)

    m_packed, m_padded = run(packed, "on"), run(padded, "off")
    assert_same_update(weights(packed), weights(padded), before, RTOL)
    for key in ("loss", "grad_norm", "kl_behave", "tokens", "entropy", "imp_seq_masked_frac"):
        assert m_packed[key] == pytest.approx(m_padded[key], rel=1e-5, abs=1e-7), key
    if objective:  # some rows masked, some kept: the rows are told apart
        assert 0 < m_padded["imp_seq_masked_frac"] < 1


def test_packing_fills_lines_no_wider_than_the_longest_row() -> None:
    samples = mixed_samples()
    rows = sequence_rows(samples)
    budget = 3 * max(len(row_tokens(r)) for r in rows)
    groups = pack_lines(samples, budget)
    kept = [[s.completion_id for s in row] for g in groups for line in g for row in line]
    assert sorted(kept) == sorted([s.completion_id for s in row] for row in rows)  # rows whole
    for lines in groups:
        width = len(row_tokens(lines[0][0]))  # the group's first row: its longest
        assert len(lines) * width <= budget
        assert all(sum(len(row_tokens(r)) for r in line) <= width for line in lines)


def test_packed_micro_batches_hold_less_padding_than_rectangles() -> None:
    samples, cpu = mixed_samples(), torch.device("cpu")
    cfg = TrainerConfig(max_tokens_per_sample=256, max_tokens_per_microbatch=256)
    packed = plan_update(samples, cfg, PAD_ID, cpu, packed=True).microbatches[0]
    padded = plan_update(samples, cfg, PAD_ID, cpu, packed=False).microbatches[0]
    assert padding_fraction(packed) < padding_fraction(padded) / 2
    assert sum(b.attention.sum() for b in packed) == sum(b.attention.sum() for b in padded)


def test_the_update_reports_the_padding_its_micro_batches_held() -> None:
    samples, cpu = mixed_samples(), torch.device("cpu")
    budget = 3 * max(len(row_tokens(r)) for r in sequence_rows(samples))
    for packing in ("on", "off"):
        cfg = TrainerConfig(
            max_tokens_per_sample=budget, max_tokens_per_microbatch=budget, packing=packing
        )
        plan = plan_update(samples, cfg, PAD_ID, cpu, packed=packing == "on")
        assert plan.padding == pytest.approx(padding_fraction(plan.microbatches[0]))
        model = tiny_model(2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        metrics = policy_update(model, optimizer, samples, cfg, PAD_ID)
        assert metrics["padding_frac"] == pytest.approx(plan.padding), packing
        assert 0 < plan.padding < 1


def test_the_sequence_mask_judges_each_packed_row_by_its_own_tokens() -> None:
    """Two rows in one line: the first's weights are far below the floor, the second's at 1."""
    logp = torch.zeros(1, 6)
    behave = torch.tensor([[2.0, 2.0, 0.0, 0.0, 0.0, 0.0]])  # w = exp(prox - behave)
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0, 1.0, 0.0]])
    segments = torch.tensor([[0, 0, -1, 1, 1, -1]])
    options = dict(clip_eps=0.2, imp_weight_cap=5.0, imp_weight_mode="mask")
    _, metrics = decoupled_ppo_loss(
        logp, logp, behave, torch.ones(1, 6), mask, **options,
        imp_weight_level="sequence", imp_weight_floor=0.5, segments=segments,
    )  # fmt: skip
    assert metrics["imp_seq_masked_frac"] == 0.5  # the first row's two tokens of four


def test_packing_is_used_where_the_model_supports_it_and_asked_for() -> None:
    model = tiny_model()
    assert supports_packing(model) and use_packing(TrainerConfig(), model)
    assert not use_packing(TrainerConfig(packing="off"), model)
    assert not supports_packing(torch.nn.Linear(2, 2))  # not a transformers family: padded
    model.config._attn_implementation = "paged|sdpa"  # an attention that ignores positions
    assert not use_packing(TrainerConfig(packing="on"), model)
