"""One rank of the two-process update test (tests/test_distributed.py), started by torchrun or by
the test's own launcher. Rank 0 writes the gathered weights, the metrics and, last, `committed`.
With --lora the ranks train a replicated LoRA policy (trainer.loop.policy.Policy) instead, and every
rank writes its own adapter and restored optimizer moments."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent / "unit"))

from update_fixtures import PAD_ID, interleaved_samples, tiny_model  # noqa: E402

from trainer.config import TrainerConfig  # noqa: E402
from trainer.loop.device import prepare_model  # noqa: E402
from trainer.loop.distributed import (  # noqa: E402
    broadcast_samples,
    full_optimizer_state,
    gather_full_state,
    init_distributed,
    is_rank0,
    load_full_state,
    load_optimizer_state,
    shard_model,
    shutdown_distributed,
)
from trainer.loop.packing import prefix_sharing, use_packing  # noqa: E402
from trainer.loop.policy import Policy  # noqa: E402
from trainer.loop.update import plan_update, policy_update  # noqa: E402

CONFIG = dict(max_tokens_per_sample=48, max_tokens_per_microbatch=48, grad_clip=1e9, device="cpu")
# With momentum, SGD's first step is still theta - lr * g, and its state holds g (to gather).
OPTIMIZER = dict(lr=0.1, momentum=0.9)
LORA = dict(lora_rank=4)
ADAPTER_SEED = 1  # the adapters' random A; rank 1 draws another until it gets rank 0's


def lora_policy(rank: int, ctx) -> Policy:
    """Rank 0's policy starts from the right weights and adapter, the others from wrong ones."""
    start = tiny_model(0 if rank == 0 else 99)
    torch.manual_seed(ADAPTER_SEED if rank == 0 else ADAPTER_SEED + 6)
    policy = Policy(start, TrainerConfig(**CONFIG, **LORA), ctx)
    # SGD as in the full-weights test: AdamW divides by sqrt(v), which turns the fp32 rounding of
    # a near-zero gradient (summed in another order over two ranks) into a visible difference.
    trainable = [p for p in policy.training.parameters() if p.requires_grad]
    policy.optimizer = torch.optim.SGD(trainable, **OPTIMIZER)
    return policy


def train_lora(ctx, out: Path) -> None:
    """Two replicated LoRA updates; every rank writes its adapter and its moments after rank 0's
    were saved and restored on every rank (a restarted trainer's path)."""
    policy = lora_policy(ctx.rank, ctx)
    samples = broadcast_samples(interleaved_samples() if is_rank0() else None)
    policy.update(samples)  # the first step moves only B (B = 0 gives A no gradient)
    metrics = policy.update(samples)
    given = policy.weights()  # rank 0: the adapter, copied into its reference; {} elsewhere
    optimizer_file = out / "optimizer.pt"
    policy.save_moments(policy.gather_moments(), optimizer_file, 1)
    for state in policy.optimizer.state.values():  # forget them: they must come back from rank 0
        state["momentum_buffer"].zero_()
    policy.restore_moments(optimizer_file, 1)
    adapter = {n: p.detach() for n, p in policy.training.named_parameters() if p.requires_grad}
    moments = {str(i): s["momentum_buffer"] for i, s in enumerate(policy.optimizer.state.values())}
    save_file(
        {n.removeprefix("module."): t for n, t in adapter.items()},
        str(out / f"adapter-{ctx.rank}.safetensors"),
    )
    save_file(moments, str(out / f"moments-{ctx.rank}.safetensors"))
    if is_rank0():
        assert given.keys() and all(torch.equal(given[n], adapter["module." + n]) for n in given)
        (out / "metrics.json").write_text(json.dumps(metrics))
    elif given:
        raise AssertionError("a rank other than 0 returned weights")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--crash-rank", type=int, default=-1)
    parser.add_argument("--hang-rank", type=int, default=-1)
    parser.add_argument("--timeout-s", type=float, default=60.0)
    parser.add_argument("--lora", action="store_true", help="a replicated LoRA policy's update")
    args = parser.parse_args()
    torch.set_num_threads(1)
    ctx = init_distributed("cpu", timeout_s=args.timeout_s)
    if args.lora:
        args.out.mkdir(parents=True, exist_ok=True)
        train_lora(ctx, args.out)
        shutdown_distributed()
        return 0
    config = TrainerConfig(**CONFIG)
    # Rank 0 alone has the right weights (it would materialize the version); the others start
    # from other ones and get rank 0's through load_full_state.
    start = tiny_model(0 if is_rank0() else 99)
    full = {k: v.detach().clone() for k, v in start.named_parameters()} if is_rank0() else None
    model = shard_model(prepare_model(start, config, ctx.device))
    load_full_state(model, full)
    optimizer = torch.optim.SGD(model.parameters(), **OPTIMIZER)
    samples = broadcast_samples(interleaved_samples() if is_rank0() else None)
    if ctx.rank == args.crash_rank:  # die in the middle of the step, after the first forward
        model.model.layers[0].register_forward_hook(lambda *a: os._exit(17))
    if ctx.rank == args.hang_rank:  # stall there instead (a stuck host, a deadlocked process)
        model.model.layers[0].register_forward_hook(lambda *a: time.sleep(3600))
    packed, share = use_packing(config, model), prefix_sharing(config, model)
    plan = plan_update(samples, config, PAD_ID, ctx.device, packed=packed, share=share)
    real = sum(1 for b in plan.microbatches[0] if b.mask.sum() > 0)
    print(f"[rank {ctx.rank}] {real} of {len(plan.microbatches[0])} micro-batches", flush=True)
    metrics = policy_update(model, optimizer, samples, config, PAD_ID)
    weights = gather_full_state(model)
    moments = full_optimizer_state(model, optimizer)
    fresh = torch.optim.SGD(model.parameters(), **OPTIMIZER)
    load_optimizer_state(model, fresh, moments or None)  # and back: a restarted trainer's path
    again = full_optimizer_state(model, fresh)
    if is_rank0():
        args.out.mkdir(parents=True, exist_ok=True)
        save_file(weights, str(args.out / "weights.safetensors"))
        buffers = {k: v["momentum_buffer"] for k, v in moments["state"].items()}
        assert all(torch.equal(v["momentum_buffer"], buffers[k]) for k, v in again["state"].items())
        save_file(buffers, str(args.out / "momentum.safetensors"))
        (args.out / "metrics.json").write_text(json.dumps(metrics))
        (args.out / "committed").write_text("ok")
    shutdown_distributed()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
