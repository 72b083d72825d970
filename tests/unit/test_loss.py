"""The decoupled PPO loss against a float64 reference written independently, term by term."""

import math

import pytest
import torch

from trainer.loop.loss import decoupled_ppo_loss, token_logprobs


def reference_loss(logp, prox, behave, adv, mask, eps, cap, mode):
    """Plain-Python float64 loss: loops over tokens, no tensor ops."""
    total, count = 0.0, 0.0
    for i in range(len(logp)):
        for t in range(len(logp[i])):
            if not mask[i][t]:
                continue
            u = math.exp(logp[i][t] - prox[i][t])
            w = math.exp(prox[i][t] - behave[i][t])
            if mode == "truncate":
                w = min(w, cap)
            elif w > cap:
                w = 0.0
            a = adv[i][t]
            total += w * min(u * a, min(max(u, 1 - eps), 1 + eps) * a)
            count += 1
    return -total / count


def random_inputs(seed: int, b: int = 4, t: int = 9):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(b, t, generator=g, dtype=torch.float64) * 3
    prox = logp + torch.randn(b, t, generator=g, dtype=torch.float64) * 0.3
    behave = prox + torch.randn(b, t, generator=g, dtype=torch.float64) * 0.8
    adv = torch.randn(b, 1, generator=g, dtype=torch.float64).expand(b, t).clone()
    mask = (torch.rand(b, t, generator=g) > 0.3).to(torch.float64)
    mask[:, :2] = 0  # prompt positions
    return logp, prox, behave, adv, mask


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("mode", ["truncate", "mask"])
def test_loss_matches_the_float64_reference(seed, mode):
    logp, prox, behave, adv, mask = random_inputs(seed)
    loss, _ = decoupled_ppo_loss(
        logp, prox, behave, adv, mask, clip_eps=0.2, imp_weight_cap=2.0, imp_weight_mode=mode
    )
    expected = reference_loss(
        logp.tolist(), prox.tolist(), behave.tolist(), adv.tolist(), mask.tolist(), 0.2, 2.0, mode
    )
    assert float(loss) == pytest.approx(expected, rel=1e-12, abs=1e-12)


def test_importance_weight_is_truncated_at_the_cap():
    one = torch.zeros(1, 1, dtype=torch.float64)
    behave = torch.full((1, 1), -5.0, dtype=torch.float64)  # w = e^5 >> cap
    adv, mask = torch.ones(1, 1, dtype=torch.float64), torch.ones(1, 1, dtype=torch.float64)
    loss, metrics = decoupled_ppo_loss(
        one, one, behave, adv, mask, clip_eps=0.2, imp_weight_cap=3.0
    )
    assert float(loss) == pytest.approx(-3.0)
    assert metrics["imp_weight_truncated_frac"] == 1.0
    masked, _ = decoupled_ppo_loss(
        one, one, behave, adv, mask, clip_eps=0.2, imp_weight_cap=3.0, imp_weight_mode="mask"
    )
    assert float(masked) == 0.0


@pytest.mark.parametrize(
    "adv, ratio, expected",
    [
        (1.0, 1.5, 1.2),  # positive advantage: ratio clipped at 1 + eps
        (1.0, 0.5, 0.5),  # positive advantage, ratio below: not clipped (min picks it)
        (-1.0, 0.5, -0.8),  # negative advantage: ratio clipped at 1 - eps
        (-1.0, 1.5, -1.5),  # negative advantage, ratio above: not clipped
    ],
)
def test_clip_binds_only_in_the_pessimistic_direction(adv, ratio, expected):
    prox = torch.zeros(1, 1, dtype=torch.float64)
    logp = torch.full((1, 1), math.log(ratio), dtype=torch.float64)
    loss, _ = decoupled_ppo_loss(
        logp,
        prox,
        prox,
        torch.full((1, 1), adv, dtype=torch.float64),
        torch.ones(1, 1, dtype=torch.float64),
        clip_eps=0.2,
        imp_weight_cap=5.0,
    )
    assert float(loss) == pytest.approx(-expected)


def test_clipped_tokens_get_no_gradient_and_others_do():
    prox = torch.zeros(1, 2, dtype=torch.float64)
    logp = torch.tensor([[math.log(1.5), math.log(1.1)]], dtype=torch.float64, requires_grad=True)
    loss, metrics = decoupled_ppo_loss(
        logp,
        prox,
        prox,
        torch.ones(1, 2, dtype=torch.float64),
        torch.ones(1, 2, dtype=torch.float64),
        clip_eps=0.2,
        imp_weight_cap=5.0,
    )
    loss.backward()
    assert logp.grad[0, 0] == 0.0 and logp.grad[0, 1] < 0.0
    assert metrics["clip_frac"] == 0.5


def test_masked_positions_do_not_count():
    logp, prox, behave, adv, mask = random_inputs(0)
    base, _ = decoupled_ppo_loss(logp, prox, behave, adv, mask, clip_eps=0.2, imp_weight_cap=5.0)
    noisy = logp.clone()
    noisy[mask == 0] += 100.0  # prompt positions may hold anything
    again, _ = decoupled_ppo_loss(noisy, prox, behave, adv, mask, clip_eps=0.2, imp_weight_cap=5.0)
    assert float(again) == pytest.approx(float(base), rel=1e-12)


def test_on_policy_loss_is_the_plain_policy_gradient():
    logp = torch.tensor([[-0.7, -1.2]], dtype=torch.float64, requires_grad=True)
    fixed = logp.detach()
    adv = torch.tensor([[0.5, 0.5]], dtype=torch.float64)
    loss, _ = decoupled_ppo_loss(
        logp,
        fixed,
        fixed,
        adv,
        torch.ones(1, 2, dtype=torch.float64),
        clip_eps=0.2,
        imp_weight_cap=5.0,
    )
    loss.backward()
    assert torch.allclose(logp.grad, -adv / 2)


def test_token_logprobs_picks_the_targets():
    logits = torch.log(torch.tensor([[[0.1, 0.9], [0.6, 0.4]]]))
    got = token_logprobs(logits, torch.tensor([[1, 0]]))
    assert torch.allclose(got, torch.log(torch.tensor([[0.9, 0.6]])))
