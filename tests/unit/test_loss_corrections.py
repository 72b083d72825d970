"""The objective's corrections against a float64 reference written independently, token by
token: clip-higher, the two-sided token mask (IcePop / MIS), sequence-level masking by the
geometric mean of the importance weight, and the entropy metric."""

import math

import pytest
import torch

from trainer.loop.loss import decoupled_ppo_loss, entropy_sum, vocabulary_logprobs


def reference(logp, prox, behave, adv, mask, *, eps, eps_high, cap, floor, mode, level):
    """Plain-Python loss and masked-token counts: loops, math.exp, no tensor ops."""
    total, count, token_masked, seq_masked = 0.0, 0.0, 0, 0
    for i in range(len(logp)):
        outputs = [t for t in range(len(logp[i])) if mask[i][t]]
        drop_row = False
        if level == "sequence" and outputs:
            logs = [prox[i][t] - behave[i][t] for t in outputs]
            geometric = math.exp(sum(logs) / len(logs))
            drop_row = geometric < floor or geometric > cap
        for t in outputs:
            count += 1
            u = math.exp(logp[i][t] - prox[i][t])
            w = math.exp(prox[i][t] - behave[i][t])
            if mode == "truncate":
                w = min(w, cap)
            elif w > cap or w < floor:
                w, token_masked = 0.0, token_masked + 1
            if drop_row:
                w, seq_masked = 0.0, seq_masked + 1
            a = adv[i][t]
            clipped = min(max(u, 1 - eps), 1 + eps_high)
            total += w * min(u * a, clipped * a)
    return -total / count, token_masked / count, seq_masked / count


def random_inputs(seed: int, b: int = 6, t: int = 9):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(b, t, generator=g, dtype=torch.float64) * 3
    prox = logp + torch.randn(b, t, generator=g, dtype=torch.float64) * 0.3
    behave = prox + torch.randn(b, t, generator=g, dtype=torch.float64) * 0.8
    adv = torch.randn(b, 1, generator=g, dtype=torch.float64).expand(b, t).clone()
    mask = (torch.rand(b, t, generator=g) > 0.3).to(torch.float64)
    mask[:, :2] = 0  # prompt positions
    return logp, prox, behave, adv, mask


CASES = [
    dict(eps=0.2, eps_high=0.28, cap=2.0, floor=0.0, mode="truncate", level="token"),
    dict(eps=0.2, eps_high=0.2, cap=2.0, floor=0.5, mode="mask", level="token"),
    dict(eps=0.1, eps_high=0.3, cap=1.5, floor=0.6, mode="mask", level="sequence"),
    dict(eps=0.2, eps_high=0.2, cap=1.3, floor=0.8, mode="truncate", level="sequence"),
]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("case", CASES)
def test_corrections_match_the_float64_reference(seed, case):
    logp, prox, behave, adv, mask = random_inputs(seed)
    loss, metrics = decoupled_ppo_loss(
        logp,
        prox,
        behave,
        adv,
        mask,
        clip_eps=case["eps"],
        clip_eps_high=case["eps_high"],
        imp_weight_cap=case["cap"],
        imp_weight_floor=case["floor"],
        imp_weight_mode=case["mode"],
        imp_weight_level=case["level"],
    )
    want, token_masked, seq_masked = reference(
        logp.tolist(), prox.tolist(), behave.tolist(), adv.tolist(), mask.tolist(), **case
    )
    assert float(loss) == pytest.approx(want, rel=1e-12, abs=1e-12)
    assert metrics["imp_token_masked_frac"] == pytest.approx(token_masked, abs=1e-12)
    assert metrics["imp_seq_masked_frac"] == pytest.approx(seq_masked, abs=1e-12)


def test_the_cases_exercise_every_mask():
    """The reference cases above are not vacuous: some tokens and some rows are masked."""
    logp, prox, behave, adv, mask = (x.tolist() for x in random_inputs(0))
    _, token_masked, _ = reference(logp, prox, behave, adv, mask, **CASES[1])
    _, _, seq_masked = reference(logp, prox, behave, adv, mask, **CASES[3])
    assert 0 < token_masked < 1 and 0 < seq_masked < 1


@pytest.mark.parametrize("adv, ratio, eps_high, expected", [(1.0, 1.5, 0.28, 1.28)])
def test_clip_higher_raises_only_the_upper_bound(adv, ratio, eps_high, expected):
    prox = torch.zeros(1, 1, dtype=torch.float64)
    logp = torch.full((1, 1), math.log(ratio), dtype=torch.float64)
    one = torch.ones(1, 1, dtype=torch.float64)
    loss, _ = decoupled_ppo_loss(
        logp, prox, prox, adv * one, one, clip_eps=0.2, clip_eps_high=eps_high, imp_weight_cap=5
    )
    assert float(loss) == pytest.approx(-expected)
    low, _ = decoupled_ppo_loss(
        torch.full((1, 1), math.log(0.5), dtype=torch.float64),
        prox,
        prox,
        -one,
        one,
        clip_eps=0.2,
        clip_eps_high=eps_high,
        imp_weight_cap=5,
    )
    assert float(low) == pytest.approx(0.8)  # the lower bound is still 1 - clip_eps


def test_entropy_sum_matches_the_definition():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 5, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]])
    want = 0.0
    for b in range(2):
        for t in range(3):
            if mask[b, t]:
                z = [math.exp(v) for v in logits[b, t].tolist()]
                p = [v / sum(z) for v in z]
                want -= sum(q * math.log(q) for q in p)
    assert entropy_sum(vocabulary_logprobs(logits), mask) == pytest.approx(want, rel=1e-6)
