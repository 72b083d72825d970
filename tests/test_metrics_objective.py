"""The objective's gauges in /metrics, read from real Postgres rows: the latest version's policy
metrics, its skipped fractions by reason kind and its sequence cuts by reason, and the sessions
dropped for non-finite numbers."""

from __future__ import annotations

import asyncio
import json

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import create_engine, text

from gateway.metrics.snapshot import read_snapshot, snapshot_registry
from migrations.runner import upgrade
from rlgw.db.engine import make_async_engine


def scrape(db_url: str) -> dict[tuple[str, frozenset], float]:
    async def read():
        engine = make_async_engine(db_url)
        try:
            return await read_snapshot(engine)
        finally:
            await engine.dispose()

    exposition = generate_latest(snapshot_registry(asyncio.run(read()))).decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(exposition)
        for s in family.samples
    }


def test_the_objectives_gauges_follow_the_latest_version_and_the_dropped_sessions(make_database):
    db_url = make_database()
    upgrade(db_url)
    engine = create_engine(db_url)
    older = {
        "entropy": 2.0,
        "kl_staleness": 0.05,
        "skipped_frac": {"stale": 0.5},
        "cuts": {"branch": 9, "output_retokenized": 9, "history_edited": 9},
    }
    latest = {
        "entropy": 1.25,
        "kl_mismatch": 0.002,
        "clip_frac": 0.1,
        "imp_weight_truncated_frac": 0.03,
        "imp_token_masked_frac": 0.02,
        "imp_seq_masked_frac": 0.25,
        "skipped_frac": {"overlong": 0.125, "non_finite": 0.25, "Bad Label!": 0.5},
        "cuts": {"branch": 3, "output_retokenized": 0, "history_edited": 1, "Bad Label!": 2},
    }
    with engine.begin() as conn:
        model_id = conn.execute(
            text("INSERT INTO models (name) VALUES ('m') RETURNING id")
        ).scalar_one()
        for version, metrics in ((1, older), (2, latest)):
            conn.execute(
                text(
                    "INSERT INTO policy_versions (model_id, version, kind, metrics) VALUES "
                    "(:m, :v, 'delta', CAST(:metrics AS jsonb))"
                ),
                {"m": model_id, "v": version, "metrics": json.dumps(metrics)},
            )
        reasons = [
            "non-finite advantage: nan (return inf; baseline none)",
            "non-finite advantage: inf (in float32)",
            "non-finite update: the loss of optimizer step 1 of 1 was NaN or infinite",
            "no learning signal: every advantage in the batch is zero (equal rewards)",
        ]
        for i, reason in enumerate(reasons):
            conn.execute(
                text(
                    "INSERT INTO sessions (id, status, train, dropped_reason) "
                    "VALUES (:id, 'dropped', true, :reason)"
                ),
                {"id": f"s{i}", "reason": reason},
            )
    engine.dispose()
    got = scrape(db_url)

    def value(name: str, **labels: str) -> float | None:
        return got.get((name, frozenset(labels.items())))

    assert value("rlgw_last_policy_entropy", model="m") == 1.25
    assert value("rlgw_last_kl_mismatch", model="m") == 0.002
    assert value("rlgw_last_kl_staleness", model="m") == 0.05  # the latest version holding it
    assert value("rlgw_last_clip_fraction", model="m") == 0.1
    assert value("rlgw_last_imp_weight_over_cap_fraction", model="m") == 0.03
    assert value("rlgw_last_imp_token_masked_fraction", model="m") == 0.02
    assert value("rlgw_last_imp_sequence_masked_fraction", model="m") == 0.25
    assert value("rlgw_last_skipped_fraction", model="m", kind="overlong") == 0.125
    assert value("rlgw_last_skipped_fraction", model="m", kind="non_finite") == 0.25
    assert value("rlgw_last_skipped_fraction", model="m", kind="stale") is None  # version 1's
    assert not [k for k in got if k[0] == "rlgw_last_skipped_fraction" and "Bad" in str(k[1])]
    assert value("rlgw_last_sequence_cuts", model="m", reason="branch") == 3  # the latest's
    assert value("rlgw_last_sequence_cuts", model="m", reason="output_retokenized") == 0
    assert value("rlgw_last_sequence_cuts", model="m", reason="history_edited") == 1
    assert not [k for k in got if k[0] == "rlgw_last_sequence_cuts" and "Bad" in str(k[1])]
    assert value("rlgw_trainer_non_finite_dropped_sessions", what="advantage") == 2
    assert value("rlgw_trainer_non_finite_dropped_sessions", what="update") == 1
