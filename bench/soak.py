"""Sustained load through the gateway: each completion a client received is stored exactly once.

    .venv/bin/python bench/soak.py [--sessions 200] [--minutes 5] [--workers 1]

Starts the fake upstream (bench/fake_upstream.py: this measures the gateway, not a model) and a real
`rlgw serve` on a fresh database of the local Postgres, then runs `--sessions` agents at once, each
playing episodes back to back (1-3 turns, half of them streamed, one turn in five retried, a reward
per session, posted twice with the same Idempotency-Key three times in ten, then close). At the end
it compares what the clients received with the database row by row, and samples the gateway's
resident memory (all its processes) every few seconds to show whether it stays flat. Results go to
bench/results/soak/ as JSON; the counts are printed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.fake_upstream import start_fake_upstream, stop, upstream_url  # noqa: E402
from bench.rlgw_process import RlgwServer  # noqa: E402
from bench.soak_agents import run_agents  # noqa: E402
from bench.soak_check import compare  # noqa: E402

MODEL = "soak"


class MemorySampler(threading.Thread):
    """Resident memory (MiB) of a process and its children, every `every_s` seconds."""

    def __init__(self, pid: int, every_s: float = 5.0) -> None:
        super().__init__(daemon=True)
        self.root, self.every_s = psutil.Process(pid), every_s
        self.samples: list[tuple[float, float]] = []
        self._halt = threading.Event()

    def rss_mib(self) -> float:
        procs = [self.root, *self.root.children(recursive=True)]
        total = 0
        for p in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                total += p.memory_info().rss
        return total / 2**20

    def run(self) -> None:
        t0 = time.monotonic()
        while not self._halt.wait(self.every_s):
            self.samples.append((time.monotonic() - t0, self.rss_mib()))

    def stop(self) -> None:
        self._halt.set()
        self.join()


def memory_verdict(samples: list[tuple[float, float]]) -> dict:
    """Flat when the last quarter's median RSS is within 10% (or 32 MiB) of the second quarter's:
    the first quarter is warm-up (pools, caches, first imports)."""
    values = [v for _, v in samples]
    if len(values) < 8:
        return {"samples": len(values), "flat": None, "note": "run too short to judge"}
    q = len(values) // 4
    early, late = statistics.median(values[q : 2 * q]), statistics.median(values[-q:])
    growth = late - early
    return {
        "samples": len(values),
        "rss_mib_first": round(values[0], 1),
        "rss_mib_second_quarter_median": round(early, 1),
        "rss_mib_last_quarter_median": round(late, 1),
        "rss_mib_peak": round(max(values), 1),
        "flat": growth <= max(0.10 * early, 32.0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=200, help="agents at once")
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--workers", type=int, default=1, help="gateway worker processes")
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432")
    parser.add_argument("--gateway-port", type=int, default=18_400)
    parser.add_argument("--upstream-port", type=int, default=18_401)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="bench/results/soak")
    args = parser.parse_args()

    print(f"[soak] fake upstream on :{args.upstream_port}", flush=True)
    upstream = start_fake_upstream(args.upstream_port, MODEL)
    try:
        with RlgwServer(args.gateway_port, pg=args.pg, workers=args.workers) as gw:
            gw.register(MODEL, upstream_url(args.upstream_port))
            sampler = MemorySampler(gw.proc.pid)
            sampler.start()
            print(
                f"[soak] {args.sessions} sessions for {args.minutes:g} min through "
                f"{gw.url} ({args.workers} worker(s))",
                flush=True,
            )
            t0 = time.monotonic()
            ledger = asyncio.run(
                run_agents(
                    gw.url,
                    MODEL,
                    sessions=args.sessions,
                    duration_s=args.minutes * 60,
                    seed=args.seed,
                )
            )
            elapsed = time.monotonic() - t0
            sampler.stop()
            result = compare(ledger, f"{gw.pg}/{gw.db}")
    finally:
        stop(upstream)
    result["completions_per_s"] = round(result["calls"] / elapsed, 1)
    result["memory"] = memory_verdict(sampler.samples)
    result["memory_samples_mib"] = [round(v, 1) for _, v in sampler.samples]
    report = {"date": datetime.now(UTC).isoformat(), "args": vars(args), "result": result}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"soak-{args.sessions}x{args.minutes:g}min-w{args.workers}.json"
    path.write_text(json.dumps(report, indent=2))
    for key, value in result.items():
        if key not in ("examples", "memory_samples_mib"):
            print(f"[soak] {key:36s} {value}", flush=True)
    print(f"[soak] written {path}", flush=True)
    sys.exit(0 if result["exactly_once"] and result["memory"]["flat"] is not False else 1)


if __name__ == "__main__":
    main()
