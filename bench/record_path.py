"""Times sequential Recorder.record() calls (implicit and named sessions) on a scratch database."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from datetime import UTC, datetime

import psycopg

import gateway.recording.recorder
from gateway.recording.lineage import request_sequence
from gateway.recording.record import CompletionRecord
from gateway.recording.recorder import Recorder
from migrations.runner import upgrade
from rlgw.db.engine import make_async_engine
from rlgw.db.urls import to_libpq_uri, to_sqlalchemy_url

BODY = {
    "model": "tiny",
    "messages": [{"role": "user", "content": "Write a short poem about the sea."}],
    "max_tokens": 64,
    "temperature": 1.0,
}


def make_record(session_id: str | None, tokens: int) -> CompletionRecord:
    record_id = "chatcmpl-" + uuid.uuid4().hex
    text = " ".join(f"w{i}" for i in range(tokens))
    now = datetime.now(UTC)
    return CompletionRecord(
        id=record_id,
        session_id=session_id or "implicit-" + record_id,
        implicit_session=session_id is None,
        api="chat.completions",
        model="tiny",
        stream=False,
        request=BODY,
        created_at=now,
        finished_at=now,
        backend_id=None,
        policy_version=0,
        prompt_token_ids=list(range(100, 130)),
        output_token_ids=list(range(1000, 1000 + tokens)),
        output_logprobs=[-0.5] * tokens,
        finish_reason="length",
        status="complete",
        response={
            "id": record_id,
            "object": "chat.completion",
            "model": "tiny",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "length",
                }
            ],
            "usage": {
                "prompt_tokens": 30,
                "completion_tokens": tokens,
                "total_tokens": 30 + tokens,
            },
        },
        latency_ms=12.0,
        sequence=request_sequence("chat.completions", BODY),
        retry_group=None if session_id is None else uuid.uuid4().hex,
        continuation_hash=uuid.uuid4().hex * 2,
        continuation_len=2,
    )


def summary(name: str, times: list[float], cpu_s: float | None = None) -> str:
    ms = sorted(t * 1000 for t in times)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    line = f"{name:<10} n={len(ms)} p50={statistics.median(ms):.2f} ms p99={p99:.2f} ms"
    if cpu_s is not None:  # this process's CPU per record: less noisy than wall time on a busy box
        line += f" cpu/record={cpu_s * 1000 / len(ms):.2f} ms"
    return line


async def timed(recorder: Recorder, make, n: int) -> tuple[list[float], float]:
    times = []
    cpu0 = time.process_time()
    for _ in range(n):
        record = make()
        t0 = time.perf_counter()
        await recorder.record(record)
        times.append(time.perf_counter() - t0)
    return times, time.process_time() - cpu0


def time_store(spent: list[float]) -> None:
    """Wrap the recorder's write so that its own time is recorded apart from the queue hop."""
    inner = gateway.recording.recorder.store_batch

    async def store_batch(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return await inner(*args, **kwargs)
        finally:
            spent.append(time.perf_counter() - t0)

    gateway.recording.recorder.store_batch = store_batch


async def run(url: str, n: int, tokens: int, named_sessions: int) -> None:
    spent: list[float] = []
    time_store(spent)
    engine = make_async_engine(url)
    recorder = Recorder(engine, queue_size=1024, batch_size=64)
    recorder.start()
    session_ids = [f"bench-{i}" for i in range(named_sessions)]
    async with engine.begin() as conn:
        for sid in session_ids:
            await conn.exec_driver_sql("INSERT INTO sessions (id) VALUES (%(id)s)", {"id": sid})
    try:
        await timed(recorder, lambda: make_record(None, tokens), 20)  # warm-up
        spent.clear()
        implicit, implicit_cpu = await timed(recorder, lambda: make_record(None, tokens), n)
        implicit_store = list(spent)
        spent.clear()
        count = iter(range(n))
        named, named_cpu = await timed(
            recorder, lambda: make_record(session_ids[next(count) % named_sessions], tokens), n
        )
        print(summary("implicit", implicit, implicit_cpu))
        print(summary("  store", implicit_store))
        print(summary("  hop", [a - b for a, b in zip(implicit, implicit_store, strict=True)]))
        print(summary("named", named, named_cpu))
        print(summary("  store", spent))
        print(summary("  hop", [a - b for a, b in zip(named, spent, strict=True)]))
    finally:
        await recorder.stop()
        await engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--admin-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("-n", type=int, default=300, help="records timed per kind")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--named-sessions", type=int, default=10)
    args = parser.parse_args()
    admin = to_libpq_uri(args.admin_url)
    name = f"rlgw_bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = to_sqlalchemy_url(admin.rsplit("/", 1)[0] + "/" + name)
    try:
        upgrade(url)
        asyncio.run(run(url, args.n, args.tokens, args.named_sessions))
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    main()
