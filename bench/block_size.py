"""What vLLM's KV block size does to agent traffic on a CPU backend: the prefix cache only holds
whole blocks, and vLLM's CPU default (128 tokens) is longer than most agents' prompts.

    .venv/bin/python bench/block_size.py                        # 128 (vLLM's CPU default) vs 32
    .venv/bin/python bench/block_size.py --block-sizes 128,32,16 --groups 24

For each block size, a vLLM CPU server of the real default model is started as the gateway's
launcher starts it (`rlgw/backend_launcher.py`, `--block-size` added), warmed up, then sent the
learning benchmark's traffic straight (no gateway): `--groups` groups of 8 chat completions, each
group one prompt of the demo's arithmetic task (trainer/models/arithmetic_task.py), temperature 1,
24 tokens at most, log-probs on, at most `--concurrency` requests at once (the demo's 24). Read
from the server's own Prometheus counters: prompt tokens, of them found in the prefix cache,
generated tokens; and the wall time and the server's CPU seconds (psutil, its whole process tree).
The last line printed is the JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402
from openai import AsyncOpenAI  # noqa: E402

from bench.cpu_usage import _tree_cpu_s  # noqa: E402
from bench.multiturn import model_path  # noqa: E402
from bench.processes import log, serve_vllm  # noqa: E402
from rlgw.backend_launcher import stop_backend  # noqa: E402
from trainer.models import arithmetic_task as task  # noqa: E402

MODEL_NAME = "block-size"
GROUP_SIZE = 8  # the demo's group_size
COUNTERS = {
    "prompt_tokens": "vllm:prompt_tokens_total",
    "prefix_hit_tokens": "vllm:prefix_cache_hits_total",
    "generated_tokens": "vllm:generation_tokens_total",
}


def counters(url: str) -> dict[str, float]:
    """The server's token counters now (Prometheus text, summed over labels)."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    found = dict.fromkeys(COUNTERS, 0.0)
    for key, metric in COUNTERS.items():
        for match in re.finditer(rf"^{re.escape(metric)}\{{[^}}]*\}} (\S+)$", text, re.M):
            found[key] += float(match.group(1))
    return found


async def traffic(url: str, groups: int, concurrency: int, seed: int) -> None:
    """`groups` groups of GROUP_SIZE completions, each group one training prompt."""
    client = AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600)
    slots = asyncio.Semaphore(concurrency)
    prompts = task.make_prompts(seed, groups)

    async def one(prompt) -> None:
        async with slots:
            await client.chat.completions.create(
                model=MODEL_NAME,
                messages=prompt.messages,
                max_tokens=task.MAX_NEW_TOKENS,
                temperature=1.0,
                logprobs=True,
            )

    await asyncio.gather(*(one(p) for p in prompts for _ in range(GROUP_SIZE)))
    await client.close()


def measure(args: argparse.Namespace, block_size: int) -> dict:
    home = Path(args.home)
    log(f"--block-size {block_size}")
    proc, url = serve_vllm(
        model_path(args.preset, home),
        MODEL_NAME,
        home / f"block-size-{block_size}.log",
        extra_args=["--block-size", str(block_size)],
    )
    try:
        asyncio.run(traffic(url, 2, args.concurrency, seed=10_000))  # warm-up, other prompts
        before, cpu0, t0 = counters(url), _tree_cpu_s(proc.pid), time.perf_counter()
        asyncio.run(traffic(url, args.groups, args.concurrency, seed=args.seed))
        wall, cpu = time.perf_counter() - t0, _tree_cpu_s(proc.pid) - cpu0
        after = counters(url)
    finally:
        stop_backend(proc)
    got = {key: int(after[key] - before[key]) for key in COUNTERS}
    log(f"--block-size {block_size}: {wall:.1f} s, {cpu:.1f} CPU s, {got}")
    return {
        "block_size": block_size,
        "wall_s": round(wall, 2),
        "server_cpu_s": round(cpu, 2),
        **got,
        "completions_per_s": round(args.groups * GROUP_SIZE / wall, 2),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="smollm2-135m-instruct", help="or tiny")
    p.add_argument("--block-sizes", default="128,32")
    p.add_argument("--groups", type=int, default=16)
    p.add_argument("--concurrency", type=int, default=24)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--home", default="bench/results/block-size-home")
    args = p.parse_args()
    started = datetime.now(UTC).isoformat(timespec="seconds")
    runs = [measure(args, int(b)) for b in args.block_sizes.split(",")]
    print(
        json.dumps(
            {
                "bench": "block_size",
                "date": started,
                "machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} CPUs",
                "preset": args.preset,
                "groups": args.groups,
                "group_size": GROUP_SIZE,
                "concurrency": args.concurrency,
                "runs": runs,
            }
        )
    )


if __name__ == "__main__":
    main()
