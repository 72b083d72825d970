"""One policy update: decoupled PPO steps over token-budgeted micro-batches, on any device."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import TrainerConfig
from . import collectives
from .device import autocast, check_placement
from .distributed import is_distributed_model
from .loss import METRICS, decoupled_ppo_loss, token_logprobs
from .microbatch import empty_batch, pack_microbatches, to_device
from .samples import Batch, Sample, collate


class UpdateOutOfMemory(RuntimeError):
    """The device ran out of memory during `policy_update`. With `steps_taken == 0` (always so
    with minibatches=1) the gradients were dropped and nothing was stepped: the model and the
    optimizer are as they were. Otherwise earlier minibatches' steps stand and the caller must
    restore the weights and optimizer state it had before the update."""

    def __init__(self, message: str, steps_taken: int) -> None:
        super().__init__(message)
        self.steps_taken = steps_taken


@dataclass
class Plan:
    """This rank's micro-batches for each minibatch, and each minibatch's global token count."""

    microbatches: list[list[Batch]]  # [minibatch][micro-batch]; equal counts on every rank
    tokens: list[float]  # output tokens of the whole minibatch over all ranks: the loss normaliser


def batch_logprobs(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """log pi(targets) under `model`: (B, L-1), at each completion's temperature and masks."""
    logits = model(input_ids=batch.inputs, attention_mask=batch.attention, use_cache=False).logits
    # logits (B, L, V) -> (B, L-1), each completion's under the processing it was sampled with
    return token_logprobs(logits[:, :-1], batch.targets, batch.sampling)


def plan_update(
    samples: list[Sample], config: TrainerConfig, pad_id: int, device: torch.device
) -> Plan:
    """Minibatches as before (disjoint slices, one optimizer step each); each rank takes every
    world-th sample of a minibatch and packs its share into micro-batches within the budget."""
    world, rank = collectives.world_size(), collectives.rank()
    minibatches = [samples[i :: config.minibatches] for i in range(config.minibatches)]
    shares = [m[rank::world] for m in minibatches if m]
    packed = [pack_microbatches(share, config.max_tokens_per_microbatch) for share in shares]
    counts = collectives.all_reduce(torch.tensor([len(p) for p in packed], device=device), "max")
    tokens = collectives.all_reduce(
        torch.tensor([sum(len(s.output_ids) for s in share) for share in shares], device=device)
    )
    microbatches = [
        [to_device(collate(group, pad_id), device) for group in groups]
        + [empty_batch(pad_id, device) for _ in range(int(count) - len(groups))]
        for groups, count in zip(packed, counts.tolist(), strict=True)
    ]
    return Plan(microbatches, [max(float(t), 1.0) for t in tokens.tolist()])


def policy_update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    samples: list[Sample],
    config: TrainerConfig,
    pad_id: int,
    *,
    scheduled: bool = False,
) -> dict[str, float]:
    """Optimise on `samples`; returns token-weighted metrics over the minibatches (all ranks).
    `scheduled`: each step's learning rate is the optimizer's initial one times the config's
    warmup factor; otherwise the optimizer's own stands (an optimizer a caller made for itself).

    Under torch.distributed the model must be sharded with `trainer.loop.distributed.shard_model`
    (or, a LoRA model, replicated with `replicate_model`) and
    every rank passes the same samples (`broadcast_samples`); the update then equals the
    single-process one. Raises UpdateOutOfMemory, naming the settings to lower, on a device OOM.
    """
    device = check_placement(model, config)
    if collectives.world_size() > 1 and not is_distributed_model(model):
        raise ValueError(
            "under torch.distributed, call trainer.loop.distributed.shard_model (or "
            "replicate_model for LoRA) first"
        )
    steps: list[int] = []  # one entry per optimizer step taken
    failure = None
    model.train()
    try:
        plan = plan_update(samples, config, pad_id, device)
        metrics = _optimise(model, optimizer, plan, config, device, steps, scheduled)
    except torch.OutOfMemoryError as err:  # handled below: `err` pins the failed graph's memory
        failure = str(err).splitlines()[0] if str(err) else "torch.OutOfMemoryError"
    finally:
        model.eval()
    if failure is not None:
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        raise UpdateOutOfMemory(_oom_message(config, device, failure, len(steps)), len(steps))
    return metrics


def _optimise(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    plan: Plan,
    config: TrainerConfig,
    device: torch.device,
    steps: list[int],
    scheduled: bool,
) -> dict[str, float]:
    """The optimizer steps of one update; `steps` grows by one per step taken."""
    world = collectives.world_size()
    # pi_prox: the weights before this version's update. For the first minibatch those ARE the
    # current weights, so pi_prox = pi_theta.detach() there (no extra forward); later minibatches
    # need theirs computed now, before the first step moves the weights.
    with torch.no_grad(), autocast(device, config.dtype):
        proximal = [[batch_logprobs(model, b) for b in mbs] for mbs in plan.microbatches[1:]]
    sums = [0.0] * (len(METRICS) + 1)  # each metric * its tokens, then the tokens
    grad_norms = 0.0  # sum over minibatches of grad_norm * tokens (already global)
    lr = optimizer.param_groups[0]["lr"]
    for i, (microbatches, n_tokens) in enumerate(zip(plan.microbatches, plan.tokens, strict=True)):
        optimizer.zero_grad(set_to_none=True)
        for j, batch in enumerate(microbatches):
            with autocast(device, config.dtype):
                logp = batch_logprobs(model, batch)
            loss, metrics = decoupled_ppo_loss(
                logp,
                logp.detach() if i == 0 else proximal[i - 1][j],
                batch.behave,
                batch.advantages,
                batch.mask,
                clip_eps=config.clip_eps,
                imp_weight_cap=config.imp_weight_cap,
                imp_weight_mode=config.imp_weight_mode,
                token_normalizer=n_tokens,  # sum over micro-batches and ranks = minibatch loss
            )
            # FSDP2 and DDP average gradients over ranks; times world it is their sum, the full
            # gradient.
            (loss * world).backward()
            weighted = [metrics[k] * metrics["tokens"] for k in METRICS] + [metrics["tokens"]]
            sums = [a + b for a, b in zip(sums, weighted, strict=True)]
        grad_norms += collectives.clip_grad_norm(model.parameters(), config.grad_clip) * n_tokens
        if scheduled:  # the step count lives in AdamW's state: the schedule survives restarts
            factor = config.warmup_factor(steps_done(optimizer) + 1)
            for group in optimizer.param_groups:  # torch's scheduler convention: initial_lr
                group["lr"] = group.setdefault("initial_lr", group["lr"]) * factor
        lr = optimizer.param_groups[0]["lr"]
        optimizer.step()
        steps.append(i)
    optimizer.zero_grad(set_to_none=True)  # free the gradients until the next update
    totals = collectives.all_reduce(torch.tensor(sums, dtype=torch.float64, device=device)).tolist()
    tokens = max(totals[-1], 1.0)
    out = {k: v / tokens for k, v in zip(METRICS, totals[:-1], strict=True)}
    return {**out, "tokens": totals[-1], "grad_norm": grad_norms / tokens, "lr": lr}


def steps_done(optimizer: torch.optim.Optimizer) -> int:
    """Optimizer steps taken over the whole run: AdamW's own count, kept in its state (saved and
    restored with the moments). 0 for an optimizer without one."""
    for state in optimizer.state.values():
        if "step" in state:
            return int(state["step"])
    return 0


def _oom_message(config: TrainerConfig, device: torch.device, failure: str, steps: int) -> str:
    advice = (
        f"lower max_tokens_per_microbatch (now {config.max_tokens_per_microbatch}; it may not go "
        f"below max_tokens_per_sample={config.max_tokens_per_sample})"
    )
    if not config.gradient_checkpointing:
        advice += " or set gradient_checkpointing=True"
    state = (
        "no optimizer step was taken: the model and optimizer are unchanged"
        if steps == 0
        else f"{steps} optimizer step(s) were taken: restore the weights from before the update"
    )
    return f"out of memory on {device} during the policy update ({failure}); {advice}; {state}"
