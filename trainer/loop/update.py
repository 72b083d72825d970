"""One policy update: decoupled PPO steps over token-budgeted micro-batches, on any device."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..config import TrainerConfig
from . import collectives
from .device import autocast, check_placement
from .distributed import is_distributed_model
from .loss import (
    METRICS,
    decoupled_ppo_loss,
    entropy_sum,
    token_logprobs,
    vocabulary_logprobs,
)
from .microbatch import empty_batch, to_device
from .packing import collate_microbatches, model_config, prefix_sharing, use_packing
from .prefix_sharing import tree_attention_mask
from .samples import Batch, Sample, sequence_rows
from .scoring import scoring_mode
from .snapshot import TrainingSnapshot

# Sums kept over the first pass besides the loss's metrics: entropy and KL(behave || prox) split
# by whether the sample came from the current version (trainer-vs-vLLM mismatch) or an older one
# (staleness), each with its token count.
PASS_SUMS = ("entropy", "kl_staleness", "stale_tokens", "kl_mismatch", "fresh_tokens")


class UpdateOutOfMemory(RuntimeError):
    """The device ran out of memory during `policy_update`. With `steps_taken == 0` (always so
    with minibatches=1) the gradients were dropped and nothing was stepped: the model and the
    optimizer are as they were. Otherwise earlier minibatches' steps stand and the caller must
    restore the weights and optimizer state it had before the update."""

    def __init__(self, message: str, steps_taken: int) -> None:
        super().__init__(message)
        self.steps_taken = steps_taken


class NonFiniteUpdate(RuntimeError):
    """A loss or a gradient norm was NaN or infinite before an optimizer step: the update is
    abandoned whole. The model's trainable weights and the optimizer's state are as they were
    before `policy_update` (restored from a snapshot when earlier steps had been taken)."""

    def __init__(self, message: str, steps_taken: int) -> None:
        super().__init__(message)
        self.steps_taken = steps_taken


@dataclass
class Plan:
    """This rank's micro-batches for each minibatch, and each minibatch's global token count."""

    microbatches: list[list[Batch]]  # [minibatch][micro-batch]; equal counts on every rank
    tokens: list[float]  # output tokens of the whole minibatch over all ranks: the loss normaliser
    padding: float = 0.0  # the share of padding among every rank's micro-batches' positions


def batch_logits(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """The model's logits (B, L, V) over the batch's lines. A packed batch passes its positions
    and no attention mask: transformers then keeps attention within each row (packing.py); the
    cache must be off, or it would not (a cache turns its packed-sequence detection off). Lines
    with shared prefixes pass their own 4D mask as well (prefix_sharing.py)."""
    if batch.positions is None:
        out = model(input_ids=batch.inputs, attention_mask=batch.attention, use_cache=False)
    elif batch.units is None:
        out = model(input_ids=batch.inputs, position_ids=batch.positions, use_cache=False)
    else:
        out = model(
            input_ids=batch.inputs,
            position_ids=batch.positions,
            attention_mask=shared_prefix_mask(model, batch.units, batch.branches),
            use_cache=False,
        )
    return out.logits


def shared_prefix_mask(
    model: torch.nn.Module, units: torch.Tensor, branches: torch.Tensor | None
) -> torch.Tensor:
    """A batch's 4D mask of shared prefixes (its `units`, `branches`), as the model's attention
    takes it: boolean for sdpa, additive for eager (in the dtype of its weights)."""
    if branches is None:
        raise ValueError("a batch with units carries branches too (samples.collate_units)")
    if getattr(model_config(model), "_attn_implementation", None) == "sdpa":
        return tree_attention_mask(units, branches)
    return tree_attention_mask(units, branches, next(model.parameters()).dtype)


def batch_logprobs(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """log pi(targets) under `model`: (B, L-1), at each completion's temperature and masks."""
    return batch_scores(model, batch)[0]


def batch_scores(model: torch.nn.Module, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """`batch_logprobs`, and the log-softmax over the vocabulary at temperature 1 it was taken
    from (B, L-1, V; the same tensor the graph holds: the entropy metric reuses it)."""
    logits = batch_logits(model, batch)[:, :-1]  # (B, L-1, V): the positions that predict
    table = vocabulary_logprobs(logits)
    # each completion's log-probs under the processing it was sampled with
    return token_logprobs(logits, batch.targets, batch.sampling, logprobs=table), table


def plan_update(
    samples: list[Sample],
    config: TrainerConfig,
    pad_id: int,
    device: torch.device,
    stop_ids: tuple[int, ...] = (),
    *,
    packed: bool = False,
    share: float | None = None,
) -> Plan:
    """Minibatches (disjoint slices of the rows, one optimizer step each); each rank takes every
    world-th row of a minibatch and packs its share into micro-batches within the budget. A row
    is a sample, or a training sequence's samples (`sequence_rows`), never split. `packed`:
    several rows to a line (trainer/loop/packing.py), sharing prefixes where `share` (an attention
    weight, `packing.prefix_sharing`) is given; otherwise a padded row per line."""
    world, rank = collectives.world_size(), collectives.rank()
    rows = sequence_rows(samples)
    minibatches = [rows[i :: config.minibatches] for i in range(config.minibatches)]
    shares = [[s for row in m[rank::world] for s in row] for m in minibatches if m]
    budget = config.max_tokens_per_microbatch
    batches = [
        collate_microbatches(mine, budget, pad_id, stop_ids, packed=packed, share=share)
        for mine in shares
    ]
    counts = collectives.all_reduce(torch.tensor([len(b) for b in batches], device=device), "max")
    tokens = collectives.all_reduce(
        torch.tensor([sum(s.trained_tokens for s in share) for share in shares], device=device)
    )
    lines = [b for share in batches for b in share]
    positions = collectives.all_reduce(  # [all positions, real tokens] over every rank
        torch.tensor(
            [sum(b.attention.numel() for b in lines), sum(int(b.attention.sum()) for b in lines)],
            device=device,
        )
    ).tolist()
    microbatches = [
        [to_device(batch, device) for batch in mine]
        + [empty_batch(pad_id, device) for _ in range(int(count) - len(mine))]
        for mine, count in zip(batches, counts.tolist(), strict=True)
    ]
    padding = 1.0 - positions[1] / max(positions[0], 1)
    return Plan(microbatches, [max(float(t), 1.0) for t in tokens.tolist()], padding)


def policy_update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    samples: list[Sample],
    config: TrainerConfig,
    pad_id: int,
    *,
    scheduled: bool = False,
    current_version: int | None = None,
    loss_hook: Callable[[torch.Tensor, int], torch.Tensor] | None = None,
    stop_ids: tuple[int, ...] = (),
) -> dict[str, float]:
    """Optimise on `samples`; returns token-weighted metrics over the minibatches (all ranks).
    `scheduled`: each step's learning rate is the optimizer's initial one times the config's
    schedule factor (warmup, decay); otherwise the optimizer's own stands (an optimizer a caller
    made for itself). `current_version`: the version the weights are, which splits the KL metric
    into staleness and mismatch (None: the newest version among the samples). `loss_hook(loss,
    step)`: what each micro-batch's loss becomes (the trainer passes `rlgw.test_hooks.nan_loss`,
    a no-op unless a test sets it; not imported here: the update path imports with torch alone).
    `stop_ids`: the model's end-of-sequence ids (`eos_ids`), masked with each request's own
    stop_token_ids where a completion was sampled with min_tokens.

    The metrics include the update's wall seconds in three sums (trainer/loop/phases.py):
    `proximal_s` (the extra forward pass for pi_prox; 0.0 when none is needed),
    `forward_backward_s` (every micro-batch's forward and backward, with the first pass's entropy
    and KL sums) and `optimizer_s` (the finiteness check, the clip and the optimizer step), summed
    over the optimizer steps, this rank's own. On CUDA the clock is read after a
    `torch.cuda.synchronize` (so queued kernels count in the phase that queued them) at three
    places only, a few times per update and never per micro-batch, where a sync is cheap: before
    the clip (free: its gradient norm is read on the host right after), after the proximal pass
    and after each optimizer step (the next forward's loss is read on the host anyway; these
    cost only the overlap of launching its first kernels with the device's queued work).

    A NaN or infinite loss or gradient norm before any step raises NonFiniteUpdate, with the
    weights and the optimizer state as they were (restored when earlier steps were taken).

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
    scoring_mode(model)  # dropout off, the LM head in fp32 (idempotent)
    # Several steps: one of them may go non-finite after others were taken; keep what to restore.
    rows = len(sequence_rows(samples))
    planned_steps = min(config.minibatches, rows) * config.epochs  # empty slices: none
    snapshot = TrainingSnapshot(model, optimizer) if planned_steps > 1 else None
    if current_version is None:
        current_version = max((v for s in samples for v in s.token_versions()), default=0)
    model.train()  # gradient checkpointing in transformers needs it; dropout is off
    try:
        packed, share = use_packing(config, model), prefix_sharing(config, model)
        plan = plan_update(samples, config, pad_id, device, stop_ids, packed=packed, share=share)
        metrics = _optimise(
            model, optimizer, plan, config, device, steps, scheduled, current_version, loss_hook
        )
    except torch.OutOfMemoryError as err:  # handled below: `err` pins the failed graph's memory
        failure = str(err).splitlines()[0] if str(err) else "torch.OutOfMemoryError"
    except NonFiniteUpdate:
        optimizer.zero_grad(set_to_none=True)
        if steps and snapshot is not None:
            snapshot.restore(model, optimizer)
        raise
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
    current_version: int,
    loss_hook: Callable[[torch.Tensor, int], torch.Tensor] | None = None,
) -> dict[str, float]:
    """The optimizer steps of one update (`epochs` passes of `minibatches` steps); `steps` grows
    by one per step taken."""
    world = collectives.world_size()
    # pi_prox: the weights before this version's update. For the first minibatch of the first
    # pass those ARE the current weights, so pi_prox = pi_theta.detach() there (no extra
    # forward); every other (pass, minibatch) needs its own computed now, before the first step.
    first_fresh = 1 if config.epochs == 1 else 0
    t_proximal = time.perf_counter()
    with torch.no_grad(), autocast(device, config.dtype):
        proximal = [
            [batch_logprobs(model, b) for b in mbs] for mbs in plan.microbatches[first_fresh:]
        ]
    timings = {  # wall seconds (policy_update's docstring)
        "proximal_s": _clock(device) - t_proximal if proximal else 0.0,
        "forward_backward_s": 0.0,
        "optimizer_s": 0.0,
    }
    sums = [0.0] * (len(METRICS) + 1)  # each metric * its tokens, then the tokens
    extra = dict.fromkeys(PASS_SUMS, 0.0)
    grad_norms = 0.0  # sum over steps of grad_norm * tokens (already global)
    lr = optimizer.param_groups[0]["lr"]
    n_minibatches = len(plan.microbatches)
    for epoch in range(config.epochs):
        for i, (microbatches, n_tokens) in enumerate(
            zip(plan.microbatches, plan.tokens, strict=True)
        ):
            step = epoch * n_minibatches + i + 1  # this update's optimizer step, from 1
            t_step = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            finite = True
            for j, batch in enumerate(microbatches):
                with autocast(device, config.dtype):
                    logp, table = batch_scores(model, batch)
                first = epoch == 0 and i == 0
                prox = logp.detach() if first else proximal[i - first_fresh][j]
                if epoch == 0:  # prox is the same every pass: measure it once
                    _first_pass_sums(extra, table, batch, prox, current_version)
                del table  # held by the graph until the backward, no longer
                loss, metrics = decoupled_ppo_loss(
                    logp,
                    prox,
                    batch.behave,
                    batch.advantages,
                    batch.mask,
                    clip_eps=config.clip_eps,
                    clip_eps_high=config.clip_high,
                    imp_weight_cap=config.imp_weight_cap,
                    imp_weight_mode=config.imp_weight_mode,
                    imp_weight_floor=config.imp_weight_floor,
                    imp_weight_level=config.imp_weight_level,
                    segments=batch.segments,
                    token_normalizer=n_tokens,  # sum over micro-batches and ranks = minibatch loss
                )
                if loss_hook is not None:
                    loss = loss_hook(loss, step)
                finite = finite and math.isfinite(float(loss.detach()))
                # FSDP2 and DDP average gradients over ranks; times world it is their sum, the
                # full gradient.
                (loss * world).backward()
                weighted = [metrics[k] * metrics["tokens"] for k in METRICS] + [metrics["tokens"]]
                sums = [a + b for a, b in zip(sums, weighted, strict=True)]
            backward_done = _clock(device)
            timings["forward_backward_s"] += backward_done - t_step
            norm = collectives.clip_grad_norm(model.parameters(), config.grad_clip)
            # Every rank must agree: a non-finite loss anywhere skips the step everywhere.
            bad = collectives.all_reduce(torch.tensor([0.0 if finite else 1.0], device=device))
            if float(bad[0]) > 0 or not math.isfinite(norm):
                what = "loss" if float(bad[0]) > 0 else "gradient norm"
                raise NonFiniteUpdate(
                    f"non-finite update: the {what} of optimizer step {step} of "
                    f"{config.epochs * n_minibatches} was NaN or infinite",
                    len(steps),
                )
            grad_norms += norm * n_tokens
            if scheduled:  # the step count lives in AdamW's state: the schedule survives restarts
                factor = config.lr_factor(steps_done(optimizer) + 1)
                for group in optimizer.param_groups:  # torch's scheduler convention: initial_lr
                    group["lr"] = group.setdefault("initial_lr", group["lr"]) * factor
            lr = optimizer.param_groups[0]["lr"]
            optimizer.step()
            timings["optimizer_s"] += _clock(device) - backward_done
            steps.append(step)
    optimizer.zero_grad(set_to_none=True)  # free the gradients until the next update
    totals = collectives.all_reduce(
        torch.tensor(sums + [extra[k] for k in PASS_SUMS], dtype=torch.float64, device=device)
    ).tolist()
    passes = dict(zip(PASS_SUMS, totals[len(sums) :], strict=True))
    totals = totals[: len(sums)]
    tokens = max(totals[-1], 1.0)
    out = {k: v / tokens for k, v in zip(METRICS, totals[:-1], strict=True)}
    first_pass_tokens = max(passes["stale_tokens"] + passes["fresh_tokens"], 1.0)
    result = {
        **out,
        "tokens": totals[-1] / config.epochs,  # output tokens trained on (each pass sees them)
        "grad_norm": grad_norms / tokens,
        "lr": lr,
        "entropy": passes["entropy"] / first_pass_tokens,
        "stale_tokens": passes["stale_tokens"],
        "fresh_tokens": passes["fresh_tokens"],
        "padding_frac": plan.padding,
    }
    # Each KL only where it has tokens (a batch of fresh samples says nothing of staleness).
    for kl, n in (("kl_staleness", "stale_tokens"), ("kl_mismatch", "fresh_tokens")):
        if passes[n] > 0:
            result[kl] = passes[kl] / passes[n]
    return {**result, **timings}


def _clock(device: torch.device) -> float:
    """time.perf_counter() once the device's queued work is done (CUDA: synchronize; called
    only where a sync is cheap, see policy_update)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _first_pass_sums(
    extra: dict[str, float],
    logprobs: torch.Tensor,
    batch: Batch,
    prox: torch.Tensor,
    current_version: int,
) -> None:
    """Add one micro-batch's entropy (from its log-softmax over the vocabulary, `batch_scores`)
    and its KL(behave || prox) split by each token's generating version to `extra`."""
    extra["entropy"] += entropy_sum(logprobs, batch.mask)
    if batch.versions is None:
        return
    with torch.no_grad():
        mask = batch.mask.to(torch.float64)
        kl = (batch.behave.double() - prox.double()) * mask
        fresh = (batch.versions == current_version).to(torch.float64) * mask
        stale = mask - fresh
        extra["kl_mismatch"] += float((kl * fresh).sum())
        extra["kl_staleness"] += float((kl * stale).sum())
        extra["fresh_tokens"] += float(fresh.sum())
        extra["stale_tokens"] += float(stale.sum())


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
