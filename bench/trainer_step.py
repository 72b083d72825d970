"""The trainer's whole update step against the raw arithmetic: claim to committed version, with
the verified swap excluded (no backend) and included (one vLLM CPU backend of the same model).

On bench-0.5b (or --preset), for fp32 and bf16: rewarded sessions in the recorded format are
written to a fresh database (`bench/trainer_step_data.py`), then the real `OnlineTrainer.step()`
(claim -> samples -> policy_update -> delta -> version row, ledger and file in one commit ->
push) runs `--steps` times after one warm-up step; between two steps, one raw forward + backward
+ AdamW step over the same tokens on the trainer's own model and optimizer (bench/
trainer_throughput.py's `raw_step`, in the update's micro-batches, padded or packed alike), so
that a shared machine's load falls on both alike.
Reported per step: tokens/s of the whole step and of its parts (train, record, push), and the
whole step over the raw step. Target (issue 13): the whole step >= 80% of the raw throughput.

    .venv/bin/python bench/trainer_step.py                         # fp32 and bf16, no backend
    .venv/bin/python bench/trainer_step.py --with-backend          # also with one vLLM backend
    .venv/bin/python bench/trainer_step.py --nproc 1,2             # also in 2 processes (FSDP2)
    .venv/bin/python bench/trainer_step.py --with-backend --quick  # the loop, real model (minutes)

JSON goes to bench/results/trainer_step.json; a markdown table is printed.
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

from bench.processes import free_port, log  # noqa: E402
from bench.trainer_step_data import (  # noqa: E402
    drop_database,
    fresh_database,
    register,
    seed_sessions,
)
from bench.trainer_throughput import raw_step  # noqa: E402
from rlgw.db.engine import make_sync_engine  # noqa: E402
from rlgw.settings import Settings  # noqa: E402
from trainer.config import TrainerConfig  # noqa: E402
from trainer.loop import collectives  # noqa: E402
from trainer.loop.microbatch import to_device  # noqa: E402
from trainer.loop.packing import collate_microbatches, prefix_sharing, use_packing  # noqa: E402
from trainer.loop.service import OnlineTrainer  # noqa: E402

RESULTS = ROOT / "bench" / "results"
MODEL_NAME = "bench-step"


def model_dir(preset: str) -> Path:
    """The preset's random model, created once under bench/results/models/."""
    from trainer.models.init_model import create_model

    path = RESULTS / "models" / preset
    if not (path / "config.json").exists():
        log(f"creating the {preset} model at {path}")
        create_model(path, preset, overwrite=True)
    return path


def start_backend(path: Path, home: Path) -> tuple[subprocess.Popen, str]:
    from rlgw.backend_launcher import start_backend as launch
    from rlgw.backend_launcher import wait_healthy
    from rlgw.ports import free_port

    port = free_port()
    log(f"starting a vLLM backend of {path.name} on port {port} (minutes on a CPU)")
    proc = launch(path, port, served_model_name=MODEL_NAME, log_path=home / f"vllm-{port}.log")
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, timeout_s=900, proc=proc)
    return proc, url


def run_one(args: argparse.Namespace, dtype: str, backend_url: str | None) -> dict | None:
    """Warm-up step, then `--steps` whole steps, each followed by a raw step on its tokens. Under
    torchrun every rank runs it: rank 0 owns the database and returns the result, the others
    follow rank 0's steps (FSDP2 shards) and their share of each raw step, and return None."""
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    path = model_dir(args.preset)
    swap = "swap" if backend_url else "noswap"
    home = RESULTS / f"trainer-step-home-{dtype}-{swap}-x{world}"
    database = args.database or f"rlgw_bench_step_{dtype}_{os.getpid()}"
    url = f"{args.pg}/{database}"
    if rank == 0:
        url = fresh_database(args.pg, database)
    settings = Settings(home=home, database_url=url)
    engine = make_sync_engine(url)  # connects only on rank 0
    batch_of = dict(sessions=args.sessions, tokens=args.tokens)
    if rank == 0:
        register(engine, MODEL_NAME, path, backend_url)
        samples = seed_sessions(engine, MODEL_NAME, version=0, seed=0, **batch_of)
    config = TrainerConfig(
        device="cpu",
        dtype=dtype,
        batch_sessions=args.sessions,
        min_sessions=args.sessions,
        max_tokens_per_sample=args.tokens + 1,
        max_tokens_per_microbatch=max(8192, args.sessions * args.tokens),
        anchor_every=10_000,  # deltas only: the step every version but the tenth ships
    )
    trainer = OnlineTrainer(settings, engine, MODEL_NAME, config, log=lambda line: None)
    if rank != 0:
        while trainer.follow():  # rank 0's step, then its raw step
            raw_share(trainer, collectives.broadcast_object(None), dtype)
        trainer.close()
        engine.dispose()
        return None
    steps: list[dict] = []
    for step in range(args.steps + 1):  # step 0: warm-up (allocation, AdamW state), not timed
        if step:
            samples = seed_sessions(
                engine, MODEL_NAME, version=trainer.version, seed=step, **batch_of
            )
        start = time.perf_counter()
        report = trainer.step()
        whole = time.perf_counter() - start
        if report is None or report.version is None:
            raise RuntimeError(f"step {step} trained nothing: {report}")
        start = time.perf_counter()
        raw_share(trainer, collectives.broadcast_object(samples), dtype)
        raw = time.perf_counter() - start
        if step:
            m = report.metrics
            steps.append(
                {
                    "whole_s": whole,
                    "raw_s": raw,
                    "train_s": m["train_s"],
                    "push_s": m.get("step_s", whole) - m["train_s"],
                    "pause_s": m.get("pause_s"),
                    "bytes": m["bytes"],
                    "swaps": m.get("swaps"),
                }
            )
            log(f"{dtype} {swap} x{world} step {step}: {steps[-1]}")
    trainer.stop_followers()
    trainer.close()
    engine.dispose()
    drop_database(args.pg, database)
    tokens = args.sessions * args.tokens
    mean = lambda key: sum(s[key] for s in steps) / len(steps)  # noqa: E731
    return {
        "dtype": dtype,
        "swap": backend_url is not None,
        "processes": world,
        "tokens_per_step": tokens,
        "steps": steps,
        "whole_tokens_per_s": tokens / mean("whole_s"),
        "raw_tokens_per_s": tokens / mean("raw_s"),
        "whole_over_raw": mean("raw_s") / mean("whole_s"),
        "best_whole_over_raw": min(s["raw_s"] for s in steps) / min(s["whole_s"] for s in steps),
    }


def raw_share(trainer: OnlineTrainer, samples: list, dtype: str) -> None:
    """This rank's share of a raw forward + backward + AdamW step over `samples`, on the
    trainer's own model and optimizer (every rank calls it: a collective when sharded)."""
    rank, world = collectives.rank(), collectives.world_size()
    mine = samples[rank::world]  # as the update splits a batch
    model, config = trainer.policy.training, trainer.config
    packed = use_packing(config, model)  # the update's micro-batches: padded or packed alike
    share = prefix_sharing(config, model)  # and their prefixes shared alike
    budget, pad_id, stops = (
        config.max_tokens_per_microbatch,
        trainer.policy.pad_id,
        trainer.policy.stop_ids,
    )
    batches = collate_microbatches(mine, budget, pad_id, stops, packed=packed, share=share)
    model.train()
    raw_step(
        model, trainer.optimizer, [to_device(b, trainer.dist.device) for b in batches], dtype, world
    )
    model.eval()


def launch(args: argparse.Namespace, dtype: str, nproc: int, backend_url: str | None) -> dict:
    """`run_one` in this process, or in `nproc` processes under torchrun (rank 0 writes the
    result as JSON for this process to read)."""
    if nproc == 1:
        return run_one(args, dtype, backend_url)
    result = RESULTS / f"trainer_step.{dtype}.x{nproc}.json"
    result.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc)]
    argv += ["--master-port", str(free_port()), str(Path(__file__)), "--worker", str(result)]
    argv += ["--dtypes", dtype, "--preset", args.preset, "--steps", str(args.steps)]
    argv += ["--sessions", str(args.sessions), "--tokens", str(args.tokens), "--pg", args.pg]
    argv += ["--database", f"rlgw_bench_step_{dtype}_{os.getpid()}_x{nproc}"]
    if backend_url:
        argv += ["--backend-url", backend_url]
    threads = str(max(1, (os.cpu_count() or 2) // nproc))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": threads}
    log(f"{dtype}: {nproc} processes under torchrun")
    run = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=7200)
    if run.returncode != 0:
        raise RuntimeError(f"{dtype} x{nproc} failed:\n{run.stdout[-2000:]}{run.stderr[-3000:]}")
    return json.loads(result.read_text())


def table(results: list[dict]) -> str:
    rows = [
        "| dtype | processes | swap | raw tok/s | whole step tok/s | whole / raw (mean) "
        "| (fastest steps) | train s | record + push s | delta MB |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        mean = lambda key, r=r: sum(s[key] for s in r["steps"]) / len(r["steps"])  # noqa: E731
        rows.append(
            f"| {r['dtype']} | {r.get('processes', 1)} | {'included' if r['swap'] else 'excluded'} "
            f"| {r['raw_tokens_per_s']:.1f} | {r['whole_tokens_per_s']:.1f} "
            f"| {r['whole_over_raw']:.0%} | {r['best_whole_over_raw']:.0%} "
            f"| {mean('train_s'):.1f} | {mean('push_s'):.1f} | {mean('bytes') / 1e6:.0f} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="bench-0.5b")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--sessions", type=int, default=2, help="sessions (samples) per step")
    p.add_argument("--tokens", type=int, default=256, help="tokens per sample, a quarter prompt")
    p.add_argument("--with-backend", action="store_true", help="also with one vLLM backend")
    p.add_argument("--nproc", default="1", help="process counts to run, e.g. 1,2 (FSDP2, gloo)")
    p.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432")
    p.add_argument("--out", default=str(RESULTS / "trainer_step.json"))
    p.add_argument(
        "--quick",
        action="store_true",
        help="the loop on the real default model instead (bench/trainer_loop.py): minutes, its "
        "JSON the last line",
    )
    p.add_argument("--versions", type=int, default=5, help="--quick: measured intervals")
    p.add_argument("--no-overlap", action="store_true", help="--quick: overlap_publish off")
    p.add_argument("--worker", type=Path, help=argparse.SUPPRESS)  # a rank: its result file
    p.add_argument("--database", help=argparse.SUPPRESS)
    p.add_argument("--backend-url", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker is not None:  # one rank under torchrun
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        result = run_one(args, args.dtypes, args.backend_url)
        if result is not None:
            args.worker.write_text(json.dumps(result))
        return 0
    torch.set_num_threads(max(1, torch.get_num_threads()))
    if args.quick:
        from bench.trainer_loop import print_result, run_quick
        from rlgw.backend_launcher import stop_backend

        print_result(run_quick(args, RESULTS, start_backend, stop_backend))
        return 0
    started = datetime.now(UTC)
    model_dir(args.preset)  # created once, before any rank needs it
    counts = [int(n) for n in args.nproc.split(",")]
    dtypes = args.dtypes.split(",")
    results = [launch(args, dtype, n, None) for n in counts for dtype in dtypes]
    if args.with_backend:
        from rlgw.backend_launcher import stop_backend

        for dtype in dtypes:  # a fresh backend each: it serves version 0
            proc, url = start_backend(model_dir(args.preset), RESULTS)
            try:
                results.append(launch(args, dtype, 1, url))
            finally:
                stop_backend(proc)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(
        json.dumps(
            {
                "started": started.isoformat(),
                "ended": datetime.now(UTC).isoformat(),
                "machine": platform.processor() or platform.machine(),
                "torch": torch.__version__,
                "argv": sys.argv[1:],
                "results": results,
            },
            indent=2,
        )
    )
    print(table(results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
