"""The trainer's processed log-probs: each of vLLM's masks against a float64 reference."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from trainer.loop.loss import token_logprobs
from trainer.loop.samples import Sample, collate
from trainer.loop.sampling_processing import (
    RowSampling,
    SamplingSettings,
    processed_logprobs,
)

VOCAB = 64
TOL = 1e-5  # float32 against float64 over 64 logits


def reference(logits, token, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, stops=()):
    """vLLM's order written out in float64, one token at a time: the stop tokens min_tokens
    masks (-inf), temperature, min-p, top-k, top-p, the sampled token kept; the log-prob over
    the kept tokens."""
    x = [-math.inf if i in stops else float(v) / temperature for i, v in enumerate(logits)]
    keep = [i not in stops for i in range(len(x))]
    if min_p > 0:
        top = max(x)
        z = sum(math.exp(v - top) for v in x)
        probs = [math.exp(v - top) / z for v in x]
        keep = [kept and probs[i] >= min_p * max(probs) for i, kept in enumerate(keep)]
    if 0 < top_k < len(x):
        kth = sorted((v for v, kept in zip(x, keep, strict=True) if kept), reverse=True)
        kth = kth[top_k - 1] if len(kth) >= top_k else -math.inf
        keep = [kept and v >= kth for v, kept in zip(x, keep, strict=True)]
    if top_p < 1.0:
        kept_ids = sorted((i for i in range(len(x)) if keep[i]), key=lambda i: x[i])
        top = max(x[i] for i in kept_ids)
        z = sum(math.exp(x[i] - top) for i in kept_ids)
        total = 0.0
        for j, i in enumerate(kept_ids):
            total += math.exp(x[i] - top) / z
            if total <= 1.0 - top_p and j < len(kept_ids) - 1:
                keep[i] = False
    keep[token] = True
    kept = [v for v, k in zip(x, keep, strict=True) if k]
    top = max(kept)
    return x[token] - (top + math.log(sum(math.exp(v - top) for v in kept)))


def _rows(n=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, VOCAB, generator=g) * 3.0
    tokens = torch.randint(0, VOCAB, (n,), generator=g)
    return logits, tokens


def _ours(logits, tokens, **s):
    n = len(tokens)
    return processed_logprobs(
        logits,
        tokens,
        torch.full((n,), s.get("temperature", 1.0)),
        torch.full((n,), s.get("top_k", 0), dtype=torch.long),
        torch.full((n,), s.get("top_p", 1.0)),
        torch.full((n,), s.get("min_p", 0.0)),
    )


@pytest.mark.parametrize(
    "settings",
    [
        {"temperature": 0.3},
        {"temperature": 1.7},
        {"top_k": 5},
        {"top_p": 0.9},
        {"top_p": 0.5, "temperature": 0.7},
        {"min_p": 0.1},
        {"min_p": 0.05, "top_k": 10, "top_p": 0.8, "temperature": 0.6},
    ],
)
def test_each_mask_matches_the_float64_reference(settings):
    logits, tokens = _rows()
    # the argmax of each row, and one token no mask keeps at these settings (the lowest logit)
    tokens = torch.cat([logits.argmax(1), tokens])
    logits = torch.cat([logits, logits])
    ours = _ours(logits, tokens, **settings)
    for i in range(len(tokens)):
        expected = reference(logits[i].double().tolist(), int(tokens[i]), **settings)
        assert abs(float(ours[i]) - expected) < TOL, (i, settings)


def test_the_masks_drop_tokens_so_the_kept_ones_gain_probability():
    logits, _ = _rows()
    best = logits.argmax(1)
    plain = torch.log_softmax(logits / 0.7, dim=-1).gather(1, best[:, None])[:, 0]
    masked = _ours(logits, best, temperature=0.7, top_p=0.5)
    # renormalised over fewer tokens: never less likely, and here all of the top tokens gain
    assert bool((masked >= plain).all()) and bool((masked > plain + 1e-3).sum() >= 4)


def test_a_token_outside_the_mask_is_kept():
    logits, _ = _rows()
    worst = logits.argmin(1)
    lp = _ours(logits, worst, top_k=1)
    assert bool(torch.isfinite(lp).all())
    # top-1 plus the sampled token: a two-token distribution
    best = logits.max(1).values
    expected = logits[torch.arange(len(worst)), worst] - torch.logaddexp(
        best, logits[torch.arange(len(worst)), worst]
    )
    assert torch.allclose(lp, expected, atol=1e-5)


def test_top_k_of_the_whole_vocabulary_and_zero_are_off():
    logits, tokens = _rows()
    plain = torch.log_softmax(logits, dim=-1).gather(1, tokens[:, None])[:, 0]
    assert torch.allclose(_ours(logits, tokens, top_k=VOCAB), plain, atol=1e-6)
    assert torch.allclose(_ours(logits, tokens, top_k=0), plain, atol=1e-6)


def test_the_gradient_reaches_only_the_kept_logits():
    logits, tokens = _rows(n=2)
    logits.requires_grad_(True)
    _ours(logits, tokens, top_k=3).sum().backward()
    touched = (logits.grad != 0).sum(1).tolist()
    top3 = logits.topk(3, dim=1).indices
    expected = [3 + int(int(tokens[i]) not in top3[i].tolist()) for i in range(2)]
    assert touched == expected


def _sample(prompt, output, sampling):
    return Sample("s", "c", prompt, output, [-1.0] * len(output), 1.0, 0, sampling)


def test_a_neutral_batch_keeps_the_plain_path_and_a_mixed_one_processes_its_outputs_only():
    neutral = collate([_sample([1, 2], [3, 4], None), _sample([1], [5], SamplingSettings())], 0)
    assert neutral.sampling is None
    hot = SamplingSettings(temperature=0.5, top_p=0.9)
    mixed = collate([_sample([1, 2], [3, 4, 8], None), _sample([1], [5, 6, 7], hot)], 0)
    assert isinstance(mixed.sampling, RowSampling)
    # row 1's output targets only (prompt length 1: target indices 0..2)
    assert mixed.sampling.positions.tolist() == [[False] * 4, [True, True, True, False]]

    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 4, VOCAB, generator=g)  # (B, L-1, V)
    targets = mixed.targets
    ours = token_logprobs(logits, targets, mixed.sampling)
    plain = token_logprobs(logits, targets)
    assert torch.equal(ours[0], plain[0]) and torch.equal(ours[1, 3], plain[1, 3])
    for t in range(3):
        expected = reference(
            logits[1, t].double().tolist(), int(targets[1, t]), temperature=0.5, top_p=0.9
        )
        assert abs(float(ours[1, t]) - expected) < TOL


def test_settings_from_a_record():
    assert SamplingSettings.from_record(None) is None
    s = SamplingSettings.from_record({"temperature": 0.3, "top_p": 0.9, "top_k": -1, "min_p": 0})
    assert s == SamplingSettings(temperature=0.3, top_k=-1, top_p=0.9, min_p=0.0)
    assert not s.neutral
    assert SamplingSettings.from_record({"temperature": 1.0, "top_k": -1}).neutral


def test_vllm_installed_masks_agree_with_ours():
    """The same rows through vLLM's own top-k/top-p function (its CPU path), as a second check
    that the order and tie rules are vLLM's."""
    ops = pytest.importorskip("vllm.v1.sample.ops.topk_topp_sampler")
    logits, tokens = _rows(n=8, seed=3)
    scaled = logits / 0.8
    k = torch.full((8,), 12, dtype=torch.long)
    p = torch.full((8,), 0.85)
    theirs = ops.apply_top_k_top_p_pytorch(scaled.clone(), k, p, allow_cpu_sync=True)
    best = logits.argmax(1)  # always kept by both, so no keep-the-sampled-token difference
    expected = torch.log_softmax(theirs, dim=-1).gather(1, best[:, None])[:, 0]
    ours = _ours(logits, best, temperature=0.8, top_k=12, top_p=0.85)
    assert np.allclose(ours.numpy(), expected.numpy(), atol=1e-6)


def test_min_tokens_masks_the_stop_tokens_of_the_first_outputs_only():
    """A completion sampled with min_tokens 2 and stop_token_ids [5]: its first two outputs
    are scored with the model's EOS (3) and 5 at -inf, the rest without; with top-p too."""
    hot = SamplingSettings(temperature=0.7, top_p=0.9, min_tokens=2, stop_token_ids=(5,))
    batch = collate([_sample([1, 2], [8, 9, 10, 11], hot)], 0, stop_ids=(3,))
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(1, 5, VOCAB, generator=g) * 2.0
    logits[0, :, 3] += 8.0  # a dominant EOS: masking it moves every other log-prob a lot
    ours = token_logprobs(logits, batch.targets, batch.sampling)
    for t in range(1, 5):  # output targets (prompt length 2: indices 1..4)
        stops = (3, 5) if t < 3 else ()
        row = logits[0, t].double().tolist()
        token = int(batch.targets[0, t])
        expected = reference(row, token, temperature=0.7, top_p=0.9, stops=stops)
        assert abs(float(ours[0, t]) - expected) < TOL
        unmasked = reference(row, token, temperature=0.7, top_p=0.9)
        assert (abs(expected - unmasked) > 0.1) == (t < 3)
