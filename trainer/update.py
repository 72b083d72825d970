"""One policy update: proximal log-probs, then optimizer steps on the decoupled PPO loss."""

from __future__ import annotations

import torch

from .config import TrainerConfig
from .loss import decoupled_ppo_loss, token_logprobs
from .samples import Batch, Sample, collate


def batch_logprobs(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """log pi(targets) under `model`: (B, L-1)."""
    logits = model(input_ids=batch.inputs, attention_mask=batch.attention).logits  # (B, L, V)
    return token_logprobs(logits[:, :-1], batch.targets)


def policy_update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    samples: list[Sample],
    config: TrainerConfig,
    pad_id: int,
) -> dict[str, float]:
    """Optimise on `samples`; returns token-weighted metrics over the minibatches."""
    model.train()
    slices = [samples[i :: config.minibatches] for i in range(config.minibatches)]
    slices = [s for s in slices if s]
    batches = [collate(s, pad_id) for s in slices]
    with torch.no_grad():  # pi_prox: the weights before this version's update
        proximal = [batch_logprobs(model, b) for b in batches]
    totals: dict[str, float] = {}
    for batch, prox in zip(batches, proximal, strict=True):
        logp = batch_logprobs(model, batch)
        loss, metrics = decoupled_ppo_loss(
            logp,
            prox,
            batch.behave,
            batch.advantages,
            batch.mask,
            clip_eps=config.clip_eps,
            imp_weight_cap=config.imp_weight_cap,
            imp_weight_mode=config.imp_weight_mode,
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        metrics["grad_norm"] = float(
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        )
        optimizer.step()
        for key, value in metrics.items():  # weight each minibatch by its tokens
            totals[key] = totals.get(key, 0.0) + value * (
                metrics["tokens"] if key != "tokens" else 1
            )
    tokens = max(totals.get("tokens", 0.0), 1.0)
    model.eval()
    return {k: (v if k == "tokens" else v / tokens) for k, v in totals.items()}
