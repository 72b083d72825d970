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
    gather_full_state,
    init_distributed,
    is_rank0,
    shard_model,
    shutdown_distributed,
)
from trainer.update import plan_update, policy_update  # noqa: E402

CONFIG = dict(max_tokens_per_sample=48, max_tokens_per_microbatch=48, grad_clip=1e9, device="cpu")


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
    model = shard_model(prepare_model(tiny_model(), config, ctx.device))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
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
    if is_rank0():
        args.out.mkdir(parents=True, exist_ok=True)
        save_file(weights, str(args.out / "weights.safetensors"))
        (args.out / "metrics.json").write_text(json.dumps(metrics))
        (args.out / "committed").write_text("ok")
    shutdown_distributed()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
