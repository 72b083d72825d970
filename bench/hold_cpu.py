"""What a vLLM CPU server paused in place costs the trainer beside it: its CPU use while it keeps
answers frozen (`POST /pause?mode=keep`, what the colocated hold does), against generating and idle.

    .venv/bin/python bench/hold_cpu.py                    # the real default model, 24 answers
    .venv/bin/python bench/hold_cpu.py --preset tiny      # plumbing

A paused engine that still holds requests keeps stepping its busy loop (an empty schedule, then
a 1 ms sleep): this measures what that loop takes from the cores the colocated trainer was given.
The server is started as the learning benchmark starts it (`rlgw/backend_launcher.py`, no
pinning); `--answers` streams of `--tokens` tokens (`ignore_eos`) are sent straight to it; the
CPU time of the server's whole process tree (psutil) is read over `--seconds` while it generates,
while it is paused with every answer kept, and once it is idle again. The last line printed is
the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402

from bench.cpu_usage import _tree_cpu_s  # noqa: E402
from bench.multiturn import model_path  # noqa: E402
from bench.processes import log, serve_vllm  # noqa: E402
from rlgw.backend_launcher import stop_backend  # noqa: E402

MODEL_NAME = "hold-cpu"


def cores_used(pid: int, seconds: float) -> float:
    """The server's process tree's CPU seconds per wall second over `seconds`."""
    cpu0, t0 = _tree_cpu_s(pid), time.monotonic()
    time.sleep(seconds)
    return (_tree_cpu_s(pid) - cpu0) / (time.monotonic() - t0)


def stream(url: str, tokens: int, counts: list[int], index: int) -> None:
    """One streamed completion; counts[index] is the number of chunks received so far."""
    body = {
        "model": MODEL_NAME,
        "prompt": f"Story {index}:",
        "max_tokens": tokens,
        "temperature": 1.0,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=600) as reply:
        for line in reply.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                counts[index] += 1


def measure(args: argparse.Namespace) -> dict:
    home = Path(args.home)
    proc, url = serve_vllm(model_path(args.preset, home), MODEL_NAME, home / "hold-cpu-vllm.log")
    try:
        httpx.post(
            f"{url}/v1/completions",
            json={"model": MODEL_NAME, "prompt": "warm up", "max_tokens": 8},
            timeout=300,
        )
        counts = [0] * args.answers
        threads = [
            threading.Thread(target=stream, args=(url, args.tokens, counts, i), daemon=True)
            for i in range(args.answers)
        ]
        for t in threads:
            t.start()
        while min(counts) < 3:  # every answer has begun
            time.sleep(0.05)
        log("generating")
        generating = cores_used(proc.pid, args.seconds)
        httpx.post(f"{url}/pause", params={"mode": "keep"}, timeout=60).raise_for_status()
        time.sleep(0.5)
        before = sum(counts)
        log("paused in place")
        paused = cores_used(proc.pid, args.seconds)
        frozen = sum(counts) == before
        httpx.post(f"{url}/resume", timeout=60).raise_for_status()
        for t in threads:
            t.join(timeout=600)
        log("idle")
        idle = cores_used(proc.pid, args.seconds)
        done = sum(counts)
    finally:
        stop_backend(proc)
    return {
        "bench": "hold_cpu",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} CPUs",
        "preset": args.preset,
        "answers": args.answers,
        "tokens": args.tokens,
        "seconds": args.seconds,
        "cores_generating": round(generating, 3),
        "cores_paused_keeping_answers": round(paused, 3),
        "cores_idle": round(idle, 3),
        "frozen_while_paused": frozen,
        "chunks_received": done,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="smollm2-135m-instruct", help="or tiny")
    p.add_argument("--answers", type=int, default=24)
    p.add_argument("--tokens", type=int, default=400)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--home", default="bench/results/hold-cpu-home")
    result = measure(p.parse_args())
    print(json.dumps(result))


if __name__ == "__main__":
    main()
