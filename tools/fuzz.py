"""A longer schemathesis run against the gateway than the one in the test suite.

    .venv/bin/python tools/fuzz.py --examples 300 --seed 1

Same harness as tests/test_fuzz.py (tests/fuzz_support.py): the in-process app on a scratch
database of the Postgres at RLGW_TEST_DATABASE_URL (default postgresql://postgres@127.0.0.1:5432/
postgres), a fake vLLM upstream, positive and negative cases for every operation of the OpenAPI
spec. Prints a JSON summary; exits 1 if anything failed (a 5xx, a traceback in a body, a non-JSON
error, a changed row)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import uuid
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from rlgw.db.urls import to_libpq_uri, to_sqlalchemy_url  # noqa: E402

from fuzz_support import run_fuzz  # noqa: E402

DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/postgres"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--examples", type=int, default=300, help="per operation and mode")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default=None, help="also write the summary (JSON) here")
    args = parser.parse_args()
    logging.basicConfig(level=logging.CRITICAL)  # the app logs each refused 5xx candidate
    admin_uri = to_libpq_uri(os.environ.get("RLGW_TEST_DATABASE_URL", DEFAULT_PG))
    created: list[str] = []

    def make_database() -> str:
        name = f"rlgw_fuzz_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(admin_uri, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        created.append(name)
        base, _, query = admin_uri.partition("?")
        return to_sqlalchemy_url(
            base.rsplit("/", 1)[0] + "/" + name + (f"?{query}" if query else "")
        )

    try:
        report = run_fuzz(
            make_database,
            max_examples=args.examples,
            seed_value=args.seed,
            log=lambda line: print(line, file=sys.stderr, flush=True),
        )
    finally:
        with psycopg.connect(admin_uri, autocommit=True) as conn:
            for name in created:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    summary = {**report.summary(), "examples": args.examples, "seed": args.seed}
    summary["by_operation"] = {
        name: {
            "cases": report.cases_by_operation[name],
            "by_status": dict(sorted(report.status_by_operation.get(name, {}).items())),
        }
        for name in report.fuzzed
    }
    summary["failure_samples"] = report.failures[:20]
    summary["changed_row_samples"] = report.changed_rows[:20]
    print(json.dumps(summary, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=2) + "\n")
    return 1 if report.failures or report.changed_rows else 0


if __name__ == "__main__":
    sys.exit(main())
