"""The trainer's forward/backward beside a generating vLLM on the same cores, by torch thread
count and OpenMP wait policy: `bench/trainer_threads.py`.

One vLLM server of the real default model (SmolLM2-135M-Instruct, shared placement: no pinning)
answers `--concurrency` chat requests at a time for the whole run. Meanwhile, for each trainer
setting in turn, a fresh child process (the OpenMP settings are read when the runtime starts)
times `--steps` forward + backward + AdamW steps of the same model in fp32 over one row of
`--tokens` random tokens, after a warm-up step. The generated tokens per second are counted
over each child's timed steps, so the price the server pays for a setting is read beside what
the trainer gains. A row with no generation (the server idle) gives the quiet reference. Then
the same with a second server started with `OMP_WAIT_POLICY=PASSIVE`. The settings are this
2-core VM's (2 threads: every core).

    .venv/bin/python bench/trainer_threads.py            # ~40 min on 2 cores

The JSON is the last line of the output.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.processes import log  # noqa: E402

RESULTS = ROOT / "bench" / "results"
SETTINGS = {  # the trainer's: name -> (torch threads, extra environment)
    "2 threads": (2, {}),
    "2 threads, passive": (2, {"OMP_WAIT_POLICY": "PASSIVE"}),
    "1 thread": (1, {}),
}
SERVERS = {  # the vLLM server's extra environment
    "server default": {},
    "server passive": {"OMP_WAIT_POLICY": "PASSIVE"},
}


def child(tokens: int, steps: int) -> None:
    """Time `steps` fwd/bwd/AdamW steps (after one warm-up); print one JSON line."""
    import torch
    from transformers import AutoModelForCausalLM

    from trainer.models.pretrained import cached_checkpoint

    torch.set_num_threads(int(os.environ["BENCH_THREADS"]))
    model = AutoModelForCausalLM.from_pretrained(cached_checkpoint(log=log), dtype=torch.float32)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    ids = torch.randint(0, model.config.vocab_size, (1, tokens))
    times = []
    for i in range(steps + 1):
        if i == 1:
            print(json.dumps({"start": time.time()}), flush=True)
        started = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if i:
            times.append(time.perf_counter() - started)
    print(json.dumps({"end": time.time(), "step_s": times}), flush=True)


class Generation:
    """`concurrency` chat requests in flight at once against the server; its generated-token
    counter (vLLM's /metrics) read every second."""

    def __init__(self, url: str, model: str, concurrency: int) -> None:
        self.url, self.model, self.concurrency = url, model, concurrency
        self.counter: list[tuple[float, float]] = []  # (time, vllm:generation_tokens_total)
        self.stop = threading.Event()
        self.threads = [
            threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True),
            threading.Thread(target=self._poll, daemon=True),
        ]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def _poll(self) -> None:
        import httpx

        while not self.stop.is_set():
            with contextlib.suppress(httpx.HTTPError):
                text = httpx.get(f"{self.url}/metrics", timeout=5).text
                total = sum(
                    float(line.rsplit(" ", 1)[1])
                    for line in text.splitlines()
                    if line.startswith("vllm:generation_tokens_total")
                )
                self.counter.append((time.time(), total))
            time.sleep(1.0)

    async def _one(self, client, n: int) -> None:
        while not self.stop.is_set():
            with contextlib.suppress(Exception):
                await client.chat.completions.create(
                    model=self.model,
                    messages=[{"role": "user", "content": f"Write a short story about {n}."}],
                    max_tokens=120,
                    temperature=1.0,
                )
            n += self.concurrency

    async def _run(self) -> None:
        from openai import AsyncOpenAI

        client = AsyncOpenAI(base_url=f"{self.url}/v1", api_key="none", max_retries=0)
        await asyncio.gather(*(self._one(client, n) for n in range(self.concurrency)))

    def tokens_per_s(self, start: float, end: float) -> float:
        inside = [(t, c) for t, c in self.counter if start <= t <= end]
        if len(inside) < 2:
            return float("nan")
        (t0, c0), (t1, c1) = inside[0], inside[-1]
        return (c1 - c0) / max(t1 - t0, 1e-9)


def measure(
    name: str, threads: int, extra: dict, args, generation: Generation | None, server: str
) -> dict:
    env = {**os.environ, **extra, "BENCH_THREADS": str(threads), "PYTHONPATH": str(ROOT)}
    env.pop("OMP_NUM_THREADS", None)
    command = [sys.executable, __file__, "--child", "--tokens", str(args.tokens)]
    command += ["--steps", str(args.steps)]
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    start, end = lines[0]["start"], lines[-1]["end"]
    steps = sorted(lines[-1]["step_s"])
    median = steps[len(steps) // 2]
    row = {
        "setting": name,
        "server": server,
        "generating": generation is not None,
        "step_s": [round(s, 2) for s in lines[-1]["step_s"]],
        "ms_per_token": round(1000 * median / args.tokens, 1),
        "generated_tokens_per_s": round(generation.tokens_per_s(start, end), 1)
        if generation
        else None,
    }
    log(f"{server}, trainer {name}{'' if generation else ' (quiet)'}: {row}")
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=2048, help="trained tokens per step")
    p.add_argument("--steps", type=int, default=3, help="timed steps per setting")
    p.add_argument("--concurrency", type=int, default=24, help="chat requests in flight")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args.tokens, args.steps)
        return 0

    from rlgw.backend_launcher import start_backend, stop_backend, wait_healthy
    from rlgw.ports import free_port
    from trainer.models.pretrained import cached_checkpoint

    started = datetime.now(UTC)
    path = cached_checkpoint(log=log)
    rows, alone = [], {}
    for server, server_env in SERVERS.items():
        port = free_port()
        log(f"starting a vLLM backend of {path.name} on port {port} ({server})")
        os.environ.update(server_env)
        proc = start_backend(
            path, port, served_model_name="threads", log_path=RESULTS / "threads.log"
        )
        for key in server_env:
            del os.environ[key]
        url = f"http://127.0.0.1:{port}"
        try:
            wait_healthy(url, timeout_s=900, proc=proc)
            if not rows:
                rows.append(measure("2 threads", 2, {}, args, None, server))
            generation = Generation(url, "threads", args.concurrency)
            generation.start()
            time.sleep(20)  # the server at its steady rate
            t0 = time.time()
            time.sleep(40)
            alone[server] = round(generation.tokens_per_s(t0, time.time()), 1)
            log(f"server {server}: generation alone {alone[server]} tokens/s")
            for name, (threads, extra) in SETTINGS.items():
                rows.append(measure(name, threads, extra, args, generation, server))
            generation.stop.set()
        finally:
            stop_backend(proc)
    result = {
        "benchmark": "trainer_threads",
        "date": f"{started:%Y-%m-%d %H:%M} UTC",
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "tokens_per_step": args.tokens,
        "concurrency": args.concurrency,
        "generation_alone_tokens_per_s": alone,
        "rows": rows,
    }
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
