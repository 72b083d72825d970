"""The policy loss: decoupled PPO with a truncated behaviour importance weight, as pure functions.

Every tensor is (B, T): B samples, T token positions; `mask` is 1 on output tokens the loss uses.
"""

from __future__ import annotations

import torch

from .sampling_processing import RowSampling, processed_token_logprobs

# The token-mean metrics decoupled_ppo_loss returns (besides `tokens`), in a fixed order.
METRICS = (
    "loss",
    "clip_frac",
    "ratio_mean",
    "imp_weight_mean",
    "imp_weight_truncated_frac",
    "imp_token_masked_frac",
    "imp_seq_masked_frac",
    "kl_behave",
)
IMP_WEIGHT_MODES = ("truncate", "mask")
IMP_WEIGHT_LEVELS = ("token", "sequence")


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
    token_normalizer: float | torch.Tensor | None = None,
    clip_eps_high: float | None = None,
    imp_weight_floor: float = 0.0,
    imp_weight_level: str = "token",
    segments: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Decoupled PPO (Fu et al. 2025, "AReaL", eq. 5), token-mean:

        u_t = pi_theta(a_t) / pi_prox(a_t)             ratio to the proximal policy
        w_t = pi_prox(a_t) / pi_behave(a_t)            behaviour importance weight
        w_t <- min(w_t, cap)  ("truncate"), or  w_t <- w_t * [floor <= w_t <= cap]  ("mask")
        L   = - sum_t m_t * w_t * min(u_t A_t, clip(u_t, 1 - eps, 1 + eps_high) A_t) / sum_t m_t

    pi_behave is the policy that generated the tokens (the RECORDED log-probs), pi_prox the
    trainer's weights before this version's update, pi_theta the weights being optimised.
    w_t carries no gradient. With fresh data (pi_behave = pi_prox = pi_theta) this is the plain
    policy gradient -A_t * grad log pi_theta(a_t).

    `eps_high` (`clip_eps_high`, DAPO's clip-higher, Yu et al. 2025) defaults to `clip_eps`. The
    mask's lower bound `floor` is IcePop's / MIS's two-sided token mask (0: none). With
    `imp_weight_level="sequence"` a whole sample (row) is masked as well when the geometric mean
    of its w_t over its output tokens, exp(mean_t log w_t), is outside [floor, cap]. Masked
    tokens stay in the denominator: they contribute zero. A row is a line of the batch, or,
    where `segments` (B, T) is given (packed lines), the positions that share a segment index.

    `token_normalizer` replaces sum_t m_t in the denominator of the returned loss. Gradient
    accumulation passes the output-token count of the whole minibatch (over every rank), so that
    the micro-batch losses SUM to L of the minibatch:  sum_k L_k = sum_k sum_{t in k} (...) / N.
    The metrics are always means over this call's own tokens (`tokens` says how many), so a
    token-weighted mean of them over micro-batches is the minibatch's.

    Metrics: `clip_frac` (share of tokens whose ratio was clipped in the direction that binds),
    `imp_weight_mean`, `imp_weight_truncated_frac` (share with w_t > cap), `imp_token_masked_frac`
    (share zeroed by the token mask), `imp_seq_masked_frac` (share in samples masked at sequence
    level), `ratio_mean`, and `kl_behave` = mean(log pi_behave - log pi_theta), an estimate of
    KL(pi_behave || pi_theta).
    """
    if imp_weight_mode not in IMP_WEIGHT_MODES:
        raise ValueError(f"imp_weight_mode must be 'truncate' or 'mask', not {imp_weight_mode!r}")
    if imp_weight_level not in IMP_WEIGHT_LEVELS:
        raise ValueError(
            f"imp_weight_level must be 'token' or 'sequence', not {imp_weight_level!r}"
        )
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    mask = mask.to(logp.dtype)
    n_tokens = mask.sum().clamp(min=1.0)
    ratio = torch.exp(logp - prox_logp)
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + eps_high)
    surrogate = torch.minimum(ratio * advantages, clipped * advantages)

    with torch.no_grad():
        log_weight = prox_logp - behave_logp
        weight = torch.exp(log_weight)
        over_cap = weight > imp_weight_cap
        token_masked = torch.zeros_like(over_cap)
        if imp_weight_mode == "truncate":
            weight = weight.clamp(max=imp_weight_cap)
        else:
            token_masked = over_cap | (weight < imp_weight_floor)
            weight = torch.where(token_masked, torch.zeros_like(weight), weight)
        seq_masked = torch.zeros_like(over_cap)
        if imp_weight_level == "sequence":
            seq_masked = _rows_outside(log_weight, mask, segments, imp_weight_floor, imp_weight_cap)
            weight = torch.where(seq_masked, torch.zeros_like(weight), weight)

    objective = -(weight * surrogate * mask).sum()  # summed over tokens; normalised below
    loss = objective / (n_tokens if token_normalizer is None else token_normalizer)

    with torch.no_grad():
        binding = (ratio * advantages > clipped * advantages).to(logp.dtype)
        sums = torch.stack(  # one device-to-host copy for all of them, not one per metric
            [
                objective,
                (binding * mask).sum(),
                (ratio * mask).sum(),
                (weight * mask).sum(),
                (over_cap.to(logp.dtype) * mask).sum(),
                (token_masked.to(logp.dtype) * mask).sum(),
                (seq_masked.to(logp.dtype) * mask).sum(),
                ((behave_logp - logp) * mask).sum(),
                mask.sum(),
            ]
        ).tolist()
    tokens = sums.pop()
    metrics = {name: value / max(tokens, 1.0) for name, value in zip(METRICS, sums, strict=True)}
    metrics["tokens"] = tokens
    return loss, metrics


def _rows_outside(
    log_weight: torch.Tensor,
    mask: torch.Tensor,
    segments: torch.Tensor | None,
    floor: float,
    cap: float,
) -> torch.Tensor:
    """(B, T) True on the positions of rows whose geometric-mean weight exp(mean_t log w_t) over
    their masked tokens is outside [floor, cap]; a row is a line, or a segment index of
    `segments` (B, T; -1 on padding, which carries no mask)."""
    if segments is None:  # a row per line
        segments = torch.arange(mask.shape[0], device=mask.device).unsqueeze(1).expand_as(mask)
    ids = segments.clamp(min=0).reshape(-1)  # (B*T,)
    n = int(ids.max()) + 1 if ids.numel() else 1
    per_row = mask.new_zeros(n).index_add_(0, ids, mask.reshape(-1)).clamp(min=1.0)  # (rows,)
    sums = mask.new_zeros(n).index_add_(0, ids, (log_weight * mask).reshape(-1))  # (rows,)
    geometric = torch.exp(sums / per_row)
    outside = (geometric < floor) | (geometric > cap)
    return outside[ids].view_as(mask)


def vocabulary_logprobs(logits: torch.Tensor) -> torch.Tensor:
    """log_softmax over the vocabulary, in fp32: (B, T, V) -> (B, T, V), at temperature 1."""
    return torch.log_softmax(logits.float(), dim=-1)


def entropy_sum(logprobs: torch.Tensor, mask: torch.Tensor) -> float:
    """sum_t m_t H(pi(. | t)) over the positions of `logprobs` (B, T, V; `vocabulary_logprobs`,
    the update's own: no second pass over the vocabulary) where mask (B, T) is nonzero,
    H = -sum_v p_v log p_v in nats, without a gradient, at those positions only (a prompt's or
    padding's entropy is a waste)."""
    with torch.no_grad():
        kept = mask != 0  # (B, T)
        table = logprobs.detach()[kept]  # (N, V)
        entropy = -(table.exp() * table).sum(dim=-1)  # (N,)
        return float((entropy * mask[kept].to(entropy.dtype)).sum())


def token_logprobs(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    sampling: RowSampling | None = None,
    *,
    logprobs: torch.Tensor | None = None,
) -> torch.Tensor:
    """log p(tokens[:, t] | ...) from logits (B, T, V) predicting tokens (B, T) -> (B, T).
    `sampling`: the positions to score under the temperature and masks their completion was
    sampled with (trainer/loop/sampling_processing.py); None: every position at temperature 1.
    `logprobs`: `vocabulary_logprobs(logits)`, where the caller has it already."""
    if logprobs is None:
        logprobs = vocabulary_logprobs(logits)  # (B, T, V)
    plain = logprobs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)  # (B, T)
    if sampling is None:
        return plain
    return processed_token_logprobs(plain, logits, tokens, sampling)
