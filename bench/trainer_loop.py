"""The trainer's loop against its raw arithmetic, on the real default model: `bench/trainer_step.py
--quick [--with-backend]`.

The real `OnlineTrainer` runs as `rlgw train` runs it (`advance`: each version recorded and pushed
while the next update computes, unless `--no-overlap`), full weights, fp32, the default
configuration's batch size (`batch_sessions`) and placement (shared), on SmolLM2-135M-Instruct
(fetched and converted into the shared cache on first use), with one vLLM backend of it
(`--with-backend`) and no generation traffic. Rewarded sessions in the recorded format, of
agent-like lengths (a 40-token prompt, answers of 8 to 120 tokens, the same mix in every
batch), are written to a fresh database before it starts, one batch per version
(`max_staleness` is raised so that none is skipped as stale: the data's age does not change the
arithmetic). A version counts as served when its push returned (every backend swapped and
verified).

    whole_over_raw = raw_s / interval_s

raw_s: the median of 3 raw forward + backward + AdamW steps over one version's batch, packed as
the trainer packs it, on the trainer's own model and optimizer, after the loop. interval_s: the
median wall time between consecutive served versions, over `--versions` intervals after a
warm-up version. The JSON is the last line of the output.
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from datetime import UTC, datetime

import torch

from bench.processes import log
from bench.trainer_step_data import drop_database, fresh_database, register, seed_sessions
from bench.trainer_throughput import raw_step
from rlgw.db.engine import make_sync_engine
from rlgw.settings import Settings
from trainer.config import TrainerConfig
from trainer.loop.microbatch import to_device
from trainer.loop.packing import collate_microbatches, prefix_sharing, use_packing
from trainer.loop.service import OnlineTrainer
from trainer.models.pretrained import cached_checkpoint

MODEL_NAME = "bench-step"  # the name bench/trainer_step.py's backend serves
PROMPT_TOKENS = 40
ANSWER_TOKENS = (8, 120)  # uniform, inclusive


def run_quick(args, results_dir, start_backend, stop_backend) -> dict:
    """One measured loop (see the module docstring); its result."""
    path = cached_checkpoint(log=log)
    config = TrainerConfig(max_staleness=10_000, overlap_publish=not args.no_overlap)
    database = f"rlgw_bench_loop_{int(time.time())}"
    url = fresh_database(args.pg, database)
    home = results_dir / "trainer-loop-home"
    engine = make_sync_engine(url)
    backend = start_backend(path, results_dir) if args.with_backend else None
    try:
        register(engine, MODEL_NAME, path, backend[1] if backend else None)
        versions = args.versions + 1  # the first is a warm-up
        batches = [seed_batch(engine, config.batch_sessions, seed=v) for v in range(versions + 1)]
        trainer = OnlineTrainer(
            Settings(home=home, database_url=url), engine, MODEL_NAME, config, log=log
        )
        try:
            served = served_times(trainer)
            finished = 0
            while finished < versions:
                last = finished + 1 == versions and trainer.inflight is not None
                call = trainer.finish if last else trainer.advance  # no overlap: all inline
                if call() is not None:
                    finished += 1
            raws = raw_steps(trainer, batches[-1], config)
        finally:
            trainer.close()
    finally:
        if backend is not None:
            stop_backend(backend[0])
        engine.dispose()
        drop_database(args.pg, database)
    intervals = [b - a for a, b in zip(served, served[1:], strict=False)][-args.versions :]
    interval, raw = statistics.median(intervals), statistics.median(raws)
    return {
        "benchmark": "trainer_loop",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": platform.processor() or platform.machine(),
        "cpus": torch.get_num_threads(),
        "model": path.name,
        "backend": bool(args.with_backend),
        "overlap_publish": config.overlap_publish,
        "batch_sessions": config.batch_sessions,
        "trained_tokens_per_version": sum(len(s.output_ids) for s in batches[0]),
        "raw_s": [round(r, 2) for r in raws],
        "interval_s": [round(i, 2) for i in intervals],
        "whole_over_raw": round(raw / interval, 3),
    }


def seed_batch(engine, sessions: int, seed: int) -> list:
    """One version's sessions: answers of agent-like lengths (uniform in ANSWER_TOKENS, the same
    mix of lengths in every batch, so that versions cost alike), rewarded +1 and -1 in turn."""
    lengths = torch.Generator().manual_seed(1000)
    lo, hi = ANSWER_TOKENS
    samples = []
    for i in range(sessions):
        answer = int(torch.randint(lo, hi + 1, (1,), generator=lengths))
        samples += seed_sessions(
            engine,
            MODEL_NAME,
            version=0,
            sessions=1,
            tokens=PROMPT_TOKENS + answer,
            seed=seed * 1000 + i,
            prompt=PROMPT_TOKENS,
            first=i,
        )
    return samples


def served_times(trainer: OnlineTrainer) -> list[float]:
    """perf_counter at each push's return (every backend swapped and verified)."""
    times: list[float] = []
    push = trainer.publisher.push

    def timed(*args, **kwargs):
        reports = push(*args, **kwargs)
        times.append(time.perf_counter())
        return reports

    trainer.publisher.push = timed
    return times


def raw_steps(trainer: OnlineTrainer, samples: list, config: TrainerConfig) -> list[float]:
    """Seconds of 3 raw updates over `samples` (bench/trainer_throughput.py's `raw_step`: a
    forward and backward per micro-batch, laid out as the update lays them out, padded or packed,
    then one AdamW step), on the trainer's own model and optimizer."""
    model = trainer.policy.training
    batches = collate_microbatches(
        samples,
        config.max_tokens_per_microbatch,
        trainer.policy.pad_id,
        trainer.policy.stop_ids,
        packed=use_packing(config, model),
        share=prefix_sharing(config, model),
    )
    batches = [to_device(b, trainer.dist.device) for b in batches]
    model.train()
    seconds = []
    for _ in range(3):
        start = time.perf_counter()
        raw_step(model, trainer.optimizer, batches, config.dtype, 1)
        seconds.append(time.perf_counter() - start)
    model.eval()
    return seconds


def print_result(result: dict) -> None:
    log(
        f"whole/raw {result['whole_over_raw']:.3f}: raw {result['raw_s']} s, "
        f"between served versions {result['interval_s']} s"
    )
    print(json.dumps(result), flush=True)
