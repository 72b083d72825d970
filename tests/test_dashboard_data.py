"""/dashboard/data's document read from real Postgres rows (no vLLM, no browser): each version
carries where its step's time went, `phases`, as the trainer noted it on the version's row."""

from __future__ import annotations

import json
from types import SimpleNamespace

from fastapi.encoders import jsonable_encoder
from sqlalchemy import create_engine, text

from gateway.dashboard.data import dashboard_data
from gateway.metrics.registry import GatewayMetrics
from migrations.runner import upgrade
from rlgw.db.engine import make_async_engine

PHASES_V1 = {"claim": 0.02, "load": 0.31, "forward_backward": 1.5, "commit": 0.05, "verify": 0.7}
PHASES_V2 = {"claim": 0.03, "forward_backward": 1.25, "write": "oops", "stage": None}


async def test_each_version_carries_its_phases(make_database) -> None:
    db_url = make_database()
    upgrade(db_url)
    engine = create_engine(db_url)
    with engine.begin() as conn:
        model_id = conn.execute(
            text("INSERT INTO models (name) VALUES ('m') RETURNING id")
        ).scalar_one()
        for version, metrics in (
            (1, {"step_s": 3.0, "phases": PHASES_V1}),
            (2, {"step_s": 2.0, "phases": PHASES_V2}),  # what is not a number is left out
            (3, {"step_s": 1.0}),  # a version recorded before the phases were
            (4, {"step_s": 1.0, "phases": "not a map"}),
        ):
            conn.execute(
                text(
                    "INSERT INTO policy_versions (model_id, version, kind, metrics) VALUES "
                    "(:m, :v, 'delta', CAST(:metrics AS jsonb))"
                ),
                {"m": model_id, "v": version, "metrics": json.dumps(metrics)},
            )
    engine.dispose()
    async_engine = make_async_engine(db_url)
    ctx = SimpleNamespace(
        engine=async_engine,
        pool=SimpleNamespace(backends=lambda: []),
        recorder=SimpleNamespace(backlog=0, written=0, failed=0, retries=0, timeouts=0),
    )
    try:
        body = await dashboard_data(ctx, GatewayMetrics())
    finally:
        await async_engine.dispose()
    data = json.loads(json.dumps(jsonable_encoder(body)))  # as GET /dashboard/data answers it
    assert data["database"]["ok"] is True
    phases = {v["version"]: v["phases"] for v in data["versions"] if v["model"] == "m"}
    assert phases == {
        1: PHASES_V1,
        2: {"claim": 0.03, "forward_backward": 1.25},
        3: {},
        4: {},
    }
