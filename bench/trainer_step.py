"""The trainer's whole update step against the raw arithmetic: claim to committed version, with
the verified swap excluded (no backend) and included (one vLLM CPU backend of the same model).

On bench-0.5b (or --preset), for fp32 and bf16: rewarded sessions in the recorded format are
written to a fresh database (`bench/trainer_step_data.py`), then the real `OnlineTrainer.step()`
(claim -> samples -> policy_update -> delta -> version row, ledger and file in one commit ->
push) runs `--steps` times after one warm-up step; between two steps, one raw forward + backward
+ AdamW step over the same tokens on the trainer's own model and optimizer (bench/
trainer_throughput.py's `raw_step`), so that a shared machine's load falls on both alike.
Reported per step: tokens/s of the whole step and of its parts (train, record, push), and the
whole step over the raw step. Target (issue 13): the whole step >= 80% of the raw throughput.

    .venv/bin/python bench/trainer_step.py                         # fp32 and bf16, no backend
    .venv/bin/python bench/trainer_step.py --with-backend          # also with one vLLM backend

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

from bench.processes import log  # noqa: E402
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
from trainer.microbatch import to_device  # noqa: E402
from trainer.samples import collate  # noqa: E402
from trainer.service import OnlineTrainer  # noqa: E402

RESULTS = ROOT / "bench" / "results"
MODEL_NAME = "bench-step"


def model_dir(preset: str) -> Path:
    """The preset's random model, created once under bench/results/models/."""
    from trainer.init_model import create_model

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


def run_one(args: argparse.Namespace, dtype: str, backend_url: str | None) -> dict:
    """Warm-up step, then `--steps` whole steps, each followed by a raw step on its tokens."""
    path = model_dir(args.preset)
    home = RESULTS / f"trainer-step-home-{dtype}-{'swap' if backend_url else 'noswap'}"
    database = f"rlgw_bench_step_{dtype}_{os.getpid()}"
    url = fresh_database(args.pg, database)
    settings = Settings(home=home, database_url=url)
    engine = make_sync_engine(url)
    register(engine, MODEL_NAME, path, backend_url)
    batch_of = dict(sessions=args.sessions, tokens=args.tokens)
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
        batch = to_device(collate(samples, trainer.policy.pad_id), trainer.dist.device)
        trainer.policy.training.train()
        start = time.perf_counter()
        raw_step(trainer.policy.training, trainer.optimizer, batch, dtype, 1)
        raw = time.perf_counter() - start
        trainer.policy.training.eval()
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
            log(f"{dtype} {'swap' if backend_url else 'no swap'} step {step}: {steps[-1]}")
    trainer.close()
    engine.dispose()
    drop_database(args.pg, database)
    tokens = args.sessions * args.tokens
    mean = lambda key: sum(s[key] for s in steps) / len(steps)  # noqa: E731
    return {
        "dtype": dtype,
        "swap": backend_url is not None,
        "tokens_per_step": tokens,
        "steps": steps,
        "whole_tokens_per_s": tokens / mean("whole_s"),
        "raw_tokens_per_s": tokens / mean("raw_s"),
        "whole_over_raw": mean("raw_s") / mean("whole_s"),
        "best_whole_over_raw": min(s["raw_s"] for s in steps) / min(s["whole_s"] for s in steps),
    }


def table(results: list[dict]) -> str:
    rows = [
        "| dtype | swap | raw tok/s | whole step tok/s | whole / raw (mean) | (fastest steps) "
        "| train s | record + push s | delta MB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        mean = lambda key, r=r: sum(s[key] for s in r["steps"]) / len(r["steps"])  # noqa: E731
        rows.append(
            f"| {r['dtype']} | {'included' if r['swap'] else 'excluded'} "
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
    p.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432")
    p.add_argument("--out", default=str(RESULTS / "trainer_step.json"))
    args = p.parse_args(argv)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    started = datetime.now(UTC)
    results = [run_one(args, dtype, None) for dtype in args.dtypes.split(",")]
    if args.with_backend:
        from rlgw.backend_launcher import stop_backend

        for dtype in args.dtypes.split(","):  # a fresh backend each: it serves version 0
            proc, url = start_backend(model_dir(args.preset), RESULTS)
            try:
                results.append(run_one(args, dtype, url))
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
