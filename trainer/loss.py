"""The policy loss: decoupled PPO with a truncated behaviour importance weight, as pure functions.

Every tensor is (B, T): B samples, T token positions; `mask` is 1 on output tokens the loss uses.
"""

from __future__ import annotations

import torch


def decoupled_ppo_loss(
    logp: torch.Tensor,
    prox_logp: torch.Tensor,
    behave_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_eps: float,
    imp_weight_cap: float,
    imp_weight_mode: str = "truncate",
) -> tuple[torch.Tensor, dict[str, float]]:
    """Decoupled PPO (Fu et al. 2025, "AReaL", eq. 5), token-mean:

        u_t = pi_theta(a_t) / pi_prox(a_t)             ratio to the proximal policy
        w_t = pi_prox(a_t) / pi_behave(a_t)            behaviour importance weight
        w_t <- min(w_t, cap)  ("truncate"), or  w_t <- w_t * [w_t <= cap]  ("mask", AReaL's code)
        L   = - sum_t m_t * w_t * min(u_t A_t, clip(u_t, 1 - eps, 1 + eps) A_t) / sum_t m_t

    pi_behave is the policy that generated the tokens (the RECORDED log-probs), pi_prox the
    trainer's weights before this version's update, pi_theta the weights being optimised.
    w_t carries no gradient. With fresh data (pi_behave = pi_prox = pi_theta) this is the plain
    policy gradient -A_t * grad log pi_theta(a_t).

    Metrics: `clip_frac` (share of tokens whose ratio was clipped in the direction that binds),
    `imp_weight_mean`, `imp_weight_truncated_frac`, `ratio_mean`, and `kl_behave` =
    mean(log pi_behave - log pi_theta), an estimate of KL(pi_behave || pi_theta).
    """
    if imp_weight_mode not in ("truncate", "mask"):
        raise ValueError(f"imp_weight_mode must be 'truncate' or 'mask', not {imp_weight_mode!r}")
    mask = mask.to(logp.dtype)
    n_tokens = mask.sum().clamp(min=1.0)
    ratio = torch.exp(logp - prox_logp)
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
    surrogate = torch.minimum(ratio * advantages, clipped * advantages)

    with torch.no_grad():
        weight = torch.exp(prox_logp - behave_logp)
        over_cap = weight > imp_weight_cap
        if imp_weight_mode == "truncate":
            weight = weight.clamp(max=imp_weight_cap)
        else:
            weight = torch.where(over_cap, torch.zeros_like(weight), weight)

    loss = -(weight * surrogate * mask).sum() / n_tokens

    with torch.no_grad():
        binding = (ratio * advantages > clipped * advantages).to(logp.dtype)
        metrics = {
            "loss": float(loss),
            "clip_frac": float((binding * mask).sum() / n_tokens),
            "ratio_mean": float((ratio * mask).sum() / n_tokens),
            "imp_weight_mean": float((weight * mask).sum() / n_tokens),
            "imp_weight_truncated_frac": float((over_cap.to(logp.dtype) * mask).sum() / n_tokens),
            "kl_behave": float(((behave_logp - logp) * mask).sum() / n_tokens),
            "tokens": float(mask.sum()),
        }
    return loss, metrics


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log p(tokens[:, t] | ...) from logits (B, T, V) predicting tokens (B, T) -> (B, T)."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)  # (B, T, V)
    return logprobs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)  # (B, T)
