"""Bytes stored per generated token in the completions table, beyond the text itself.

Writes N recorded completions (default 1,000 of 256 output tokens) through the gateway's own row
encoding into a fresh database, then measures the table's total size (heap + TOAST + indexes).

    .venv/bin/python bench/storage_per_token.py [--completions 1000] [--tokens 256]

Uses RLGW_BENCH_DATABASE_URL, else the local Postgres at 127.0.0.1:5432, else an embedded one.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import string
import sys
import tempfile
import uuid
from datetime import UTC, datetime
from pathlib import Path

import psycopg
from sqlalchemy import create_engine, insert, text

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway.recording.record import CompletionRecord  # noqa: E402
from migrations.runner import upgrade  # noqa: E402
from rlgw.db.models import AgentSession, Completion  # noqa: E402
from rlgw.db.urls import to_sqlalchemy_url  # noqa: E402

LOCAL_PG = "postgresql://postgres@127.0.0.1:5432/postgres"
PROMPT_TOKENS = 48


def admin_uri() -> str:
    import os

    uri = os.environ.get("RLGW_BENCH_DATABASE_URL", LOCAL_PG)
    try:
        psycopg.connect(uri, connect_timeout=3).close()
        return uri
    except psycopg.OperationalError:
        import pgserver

        return pgserver.get_server(Path(tempfile.mkdtemp()), cleanup_mode="delete").get_uri()


def fake_record(rng: random.Random, vocab: int, n_tokens: int, session_id: str) -> tuple[dict, int]:
    """A completion shaped like a real one; returns its row and the bytes of text it carries."""
    prompt_text = "".join(rng.choices(string.ascii_letters + " ", k=PROMPT_TOKENS * 4))
    output_text = "".join(rng.choices(string.ascii_letters + " ", k=n_tokens * 4))
    rid = f"chatcmpl-{uuid.uuid4().hex}"
    now = datetime.now(UTC)
    rec = CompletionRecord(
        id=rid,
        session_id=session_id,
        implicit_session=False,
        api="chat.completions",
        model="policy",
        stream=False,
        created_at=now,
        finished_at=now,
        request={
            "model": "policy",
            "messages": [{"role": "user", "content": prompt_text}],
            "max_tokens": n_tokens,
            "temperature": 1.0,
        },
        policy_version=3,
        backend_id=None,
        prompt_token_ids=[rng.randrange(vocab) for _ in range(PROMPT_TOKENS)],
        output_token_ids=[rng.randrange(vocab) for _ in range(n_tokens)],
        output_logprobs=[-rng.expovariate(1.0) for _ in range(n_tokens)],
        finish_reason="length",
        status="complete",
        latency_ms=812.5,
        ttft_ms=20.1,
        response={
            "id": rid,
            "object": "chat.completion",
            "created": int(now.timestamp()),
            "model": "policy",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "length",
                    "message": {"role": "assistant", "content": output_text},
                }
            ],
            "usage": {
                "prompt_tokens": PROMPT_TOKENS,
                "completion_tokens": n_tokens,
                "total_tokens": PROMPT_TOKENS + n_tokens,
            },
        },
    )
    return rec.row(), len(prompt_text.encode()) + len(output_text.encode())


def measure(admin: str, vocab: int, n: int, n_tokens: int) -> dict:
    name = f"rlgw_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base, _, query = admin.partition("?")
    url = to_sqlalchemy_url(base.rsplit("/", 1)[0] + "/" + name + (f"?{query}" if query else ""))
    try:
        upgrade(url)
        engine = create_engine(url)
        rng = random.Random(0)
        text_bytes = 0
        with engine.begin() as conn:
            conn.execute(insert(AgentSession), [{"id": "bench"}])
            rows = []
            for _ in range(n):
                row, tb = fake_record(rng, vocab, n_tokens, "bench")
                rows.append(row)
                text_bytes += tb
            conn.execute(insert(Completion), rows)
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM ANALYZE completions"))
            total = conn.execute(text("SELECT pg_total_relation_size('completions')")).scalar_one()
            heap = conn.execute(text("SELECT pg_relation_size('completions')")).scalar_one()
        engine.dispose()
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    tokens = n * n_tokens
    return {
        "vocab": vocab,
        "completions": n,
        "output_tokens_each": n_tokens,
        "prompt_tokens_each": PROMPT_TOKENS,
        "table_bytes": total,
        "heap_bytes": heap,
        "text_bytes": text_bytes,
        "bytes_per_token": total / tokens,
        "bytes_per_token_beyond_text": (total - text_bytes) / tokens,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--completions", type=int, default=1000)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--out", default="bench/results/storage.json")
    args = parser.parse_args()
    admin = admin_uri()
    results = []
    for vocab in (259, 151_936):  # the tiny byte-level model; a Qwen2-sized vocabulary
        print(
            f"[storage] vocab {vocab}: writing {args.completions} completions "
            f"of {args.tokens} tokens",
            flush=True,
        )
        results.append(measure(admin, vocab, args.completions, args.tokens))
    print("\n| vocab | table bytes | text bytes | bytes/token | beyond text (target <= 16) |")
    print("|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['vocab']:,} | {r['table_bytes']:,} | {r['text_bytes']:,} | "
            f"{r['bytes_per_token']:.2f} | {r['bytes_per_token_beyond_text']:.2f} |"
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "date": datetime.now(UTC).isoformat(),
                "machine": f"{platform.machine()} {platform.node()}",
                "results": results,
            },
            indent=2,
        )
    )
    print(f"\n[storage] written {out}")


if __name__ == "__main__":
    main()
