"""One rank of the two-process update test (tests/test_distributed.py), started by torchrun or by
the test's own launcher. Rank 0 writes the gathered weights, the metrics and, last, `committed`."""

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
from trainer.device import prepare_model  # noqa: E402
from trainer.distributed import (  # noqa: E402
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
from trainer.update import plan_update, policy_update  # noqa: E402

CONFIG = dict(max_tokens_per_sample=48, max_tokens_per_microbatch=48, grad_clip=1e9, device="cpu")
# With momentum, SGD's first step is still theta - lr * g, and its state holds g (to gather).
OPTIMIZER = dict(lr=0.1, momentum=0.9)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--crash-rank", type=int, default=-1)
    parser.add_argument("--hang-rank", type=int, default=-1)
    parser.add_argument("--timeout-s", type=float, default=60.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    ctx = init_distributed("cpu", timeout_s=args.timeout_s)
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
    plan = plan_update(samples, config, PAD_ID, ctx.device)
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
