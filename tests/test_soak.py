"""A short soak (seconds, not minutes): two gateway workers, many sessions at once, retries, streams
and repeated reward posts; every completion a client received is stored exactly once.

The upstream is bench/fake_upstream.py: this checks the gateway's write path under load, where a
real model would only slow the run down."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest

from bench.fake_upstream import start_fake_upstream, stop, upstream_url
from bench.soak_agents import run_agents
from bench.soak_check import compare
from migrations.runner import upgrade
from rlgw.db.engine import make_sync_engine, sync_session_factory
from rlgw.db.urls import to_libpq_uri
from rlgw.registry import register_backend

from conftest import ADMIN_KEY, free_port
from serve_process import serve_process

MODEL = "soak"


@pytest.fixture
def fake_upstream(tmp_path: Path):
    port = free_port()
    proc = start_fake_upstream(port, MODEL, log_path=tmp_path / "upstream.log")
    yield upstream_url(port)
    stop(proc)


def wait_routed(gateway_url: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while MODEL not in [m["id"] for m in httpx.get(f"{gateway_url}/v1/models").json()["data"]]:
        assert time.monotonic() < deadline, "the gateway does not route the registered model"
        time.sleep(0.2)


def test_short_soak_with_two_workers_records_every_delivered_completion_once(
    make_database, fake_upstream: str, tmp_path: Path
):
    url = make_database()
    upgrade(url)
    engine = make_sync_engine(url)
    register_backend(sync_session_factory(engine), MODEL, fake_upstream)
    engine.dispose()
    env = {
        "RLGW_ADMIN_KEY": ADMIN_KEY,
        "RLGW_AUTH": "off",
        "RLGW_RATE_LIMIT_RPS": "0",
        # A busy CI machine must not turn slow commits into 503s here: this test is about
        # exactly-once under load (the fault behaviour is tests/test_db_faults.py's).
        "RLGW_RECORD_RETRY_S": "60",
    }
    with serve_process(url, workers=2, log_path=tmp_path / "serve.log", **env) as gw:
        wait_routed(gw)
        ledger = asyncio.run(run_agents(gw, MODEL, sessions=40, duration_s=15, seed=1))
    result = compare(ledger, to_libpq_uri(url))
    assert result["failed_calls"] == 0, result["examples"]["failures"]
    assert result["calls"] >= 40 and result["retries"] > 0  # the mix really ran
    assert result["delivered"] == result["complete_rows"] == result["calls"]
    assert result["missing"] == result["duplicated"] == 0
    assert result["complete_but_not_delivered"] == 0
    assert result["sessions_with_row_count_mismatch"] == 0
    assert result["rewards_posted"] > result["rewards_stored"] == result["sessions"]
    assert result["sessions_with_reward_mismatch"] == 0
    assert result["exactly_once"]
