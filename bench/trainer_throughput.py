"""Trainer throughput on this machine: raw forward + backward + AdamW vs `policy_update`.

On bench-0.5b (init_model's preset: Qwen2 0.5B shapes, byte vocabulary, 358M parameters), for
fp32 and bf16 autocast, in 1 process and in 2 (FSDP2 over gloo, torchrun): the same tokens (a
batch of `--samples` x `--tokens`, a quarter prompt) go through

  raw:    model(...) -> log-probs of the targets -> mean over output tokens -> backward -> AdamW
  update: trainer.loop.update.policy_update (collation, micro-batches, the decoupled PPO loss,
          global grad-norm clipping, AdamW), one minibatch, one micro-batch per rank

interleaved step by step (raw, update, raw, update, ...) after one warm-up step of each, so that
a shared machine's load falls on both alike. Target: update >= 80% of raw tokens/s.

    .venv/bin/python bench/trainer_throughput.py [--steps 2] [--samples 2] [--tokens 256]

Prints a markdown table; JSON goes to bench/results/trainer_throughput.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlgw.ports import free_port  # noqa: E402
from trainer.config import TrainerConfig  # noqa: E402
from trainer.loop import distributed  # noqa: E402
from trainer.loop.device import autocast, prepare_model  # noqa: E402
from trainer.loop.loss import token_logprobs  # noqa: E402
from trainer.loop.microbatch import to_device  # noqa: E402
from trainer.loop.samples import Batch, Sample, collate  # noqa: E402
from trainer.loop.update import batch_logits, policy_update  # noqa: E402
from trainer.models.byte_model import ENDOFTEXT_ID, PRESETS, VOCAB_SIZE, build_model  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "trainer_throughput.json"


def make_samples(n: int, tokens: int) -> list[Sample]:
    gen = torch.Generator().manual_seed(0)
    prompt = tokens // 4
    out = []
    for i in range(n):
        ids = torch.randint(0, 256, (tokens,), generator=gen).tolist()
        behave = [-5.5] * (tokens - prompt)
        out.append(Sample("s", f"c{i}", ids[:prompt], ids[prompt:], behave, (-1.0) ** i, 0))
    return out


def raw_step(model, optimizer, batches: list[Batch], dtype: str, world: int) -> None:
    """The arithmetic floor: a forward and backward per micro-batch (laid out as the update lays
    them out, padded or packed: `batch_logits`), then one AdamW step, on the same tokens."""
    tokens = sum(float(b.mask.sum()) for b in batches)
    for batch in batches:
        with autocast(batch.inputs.device, dtype):
            logits = batch_logits(model, batch)  # (B, L, V)
        logp = token_logprobs(logits[:, :-1], batch.targets)  # (B, L-1)
        loss = -(logp * batch.mask).sum() / tokens
        (loss * world).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def worker(args: argparse.Namespace) -> dict | None:
    """One configuration (dtype, 1 or 2 processes): interleaved raw and update steps. The
    result on rank 0, None on the other ranks."""
    ctx = distributed.init_distributed("cpu")
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // ctx.world_size))
    config = TrainerConfig(device="cpu", dtype=args.dtype, max_tokens_per_microbatch=8192)
    model = prepare_model(build_model(PRESETS[args.preset], seed=0), config)
    params = sum(p.numel() for p in model.parameters())
    if ctx.world_size > 1:
        model = distributed.shard_model(model)
    samples = make_samples(args.samples, args.tokens)
    mine = samples[ctx.rank :: ctx.world_size]  # the raw step's share, as the update splits it
    batch = to_device(collate(mine, ENDOFTEXT_ID), ctx.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)  # one for both: half the memory
    times: dict[str, list[float]] = {"raw": [], "update": []}
    model.train()
    for step in range(args.steps + 1):  # step 0: warm-up (allocation, AdamW state), not timed
        for kind in ("raw", "update"):
            start = time.perf_counter()
            if kind == "raw":
                raw_step(model, optimizer, [batch], args.dtype, ctx.world_size)
            else:
                policy_update(model, optimizer, samples, config, ENDOFTEXT_ID)
                model.train()
            if step:
                times[kind].append(time.perf_counter() - start)
    tokens = args.samples * args.tokens
    result = {
        "dtype": args.dtype,
        "processes": ctx.world_size,
        "params": params,
        "threads_per_process": torch.get_num_threads(),
        "tokens_per_step": tokens,
        "raw_step_s": times["raw"],
        "update_step_s": times["update"],
        "raw_tokens_per_s": tokens / (sum(times["raw"]) / len(times["raw"])),
        "update_tokens_per_s": tokens / (sum(times["update"]) / len(times["update"])),
    }
    result["update_over_raw"] = result["update_tokens_per_s"] / result["raw_tokens_per_s"]
    # The fastest step of each kind: on a shared machine the least disturbed measurement.
    result["raw_best_tokens_per_s"] = tokens / min(times["raw"])
    result["update_best_tokens_per_s"] = tokens / min(times["update"])
    distributed.shutdown_distributed()
    return result if ctx.rank == 0 else None


def launch(dtype: str, processes: int, args: argparse.Namespace) -> dict:
    """Run one configuration in fresh processes (torchrun for 2); its rank 0 writes the JSON."""
    result = RESULTS.parent / f"trainer_throughput.{dtype}.x{processes}.json"
    result.unlink(missing_ok=True)
    worker_args = [str(Path(__file__)), "--worker", "--dtype", dtype, "--steps", str(args.steps)]
    worker_args += ["--result", str(result)]
    worker_args += ["--preset", args.preset]
    worker_args += ["--samples", str(args.samples), "--tokens", str(args.tokens)]
    if processes == 1:
        argv = [sys.executable, *worker_args]
    else:
        argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(processes)]
        argv += ["--master-port", str(free_port()), *worker_args]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(2 // processes or 1)}
    run = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=3600)
    if run.returncode != 0:
        raise RuntimeError(f"{dtype} x{processes} failed:\n{run.stderr[-3000:]}")
    return json.loads(result.read_text())


def table(results: list[dict]) -> str:
    """Mean and best (fastest) step of each kind, in tokens/s, and update / raw for both."""
    rows = [
        "| dtype | processes | raw tok/s mean / best | update tok/s mean / best "
        "| update / raw, mean / best | target >= 80% (best) |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        raw, update = r["raw_step_s"], r["update_step_s"]
        tokens = r["tokens_per_step"]
        best = min(raw) / min(update)  # = update tokens/s / raw tokens/s at the fastest steps
        mean = sum(raw) / sum(update)
        rows.append(
            f"| {r['dtype']} | {r['processes']} | {tokens * len(raw) / sum(raw):.1f} / "
            f"{tokens / min(raw):.1f} | {tokens * len(update) / sum(update):.1f} / "
            f"{tokens / min(update):.1f} | {mean:.0%} / {best:.0%} | "
            f"{'met' if best >= 0.8 else '**missed**'} |"
        )
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--preset", default="bench-0.5b", choices=sorted(PRESETS))
    parser.add_argument("--steps", type=int, default=2, help="timed steps of each kind")
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=256, help="tokens per sample")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--processes", default="1,2")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--dtype", default="float32", help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        result = worker(args)
        if result is not None:
            args.result.write_text(json.dumps(result) + "\n")
        return 0
    load_before = os.getloadavg()
    results = []
    for dtype in args.dtypes.split(","):
        for processes in (int(p) for p in args.processes.split(",")):
            print(f"[throughput] {dtype} x{processes} ...", file=sys.stderr, flush=True)
            results.append(launch(dtype, processes, args))
            print(f"[throughput]   {json.dumps(results[-1])}", file=sys.stderr, flush=True)
    report = {
        "preset": args.preset,
        "vocab": VOCAB_SIZE,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "torch": torch.__version__,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "results": results,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(table(results))
    print(f"\nload average before {load_before}, after {report['load_average_after']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
