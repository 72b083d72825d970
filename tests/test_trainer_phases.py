"""Where a version's step time goes, end to end without vLLM (real Postgres, the tiny model on
the CPU, no backend registered): the trainer's step notes its phases on the version's row, prints
the `[phases]` line after its progress line, and writes them to TensorBoard."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session
from trainer_sessions import rewarded_sessions

from migrations.runner import upgrade
from rlgw.db.engine import make_sync_engine, sync_session_factory
from rlgw.db.models import PolicyVersion
from rlgw.registry import store_model
from trainer.config import TrainerConfig
from trainer.loop.phases import PHASES, other_seconds
from trainer.loop.service import OnlineTrainer

from conftest import MODEL_NAME, gateway_settings

# step() publishes in line: no `launch` (a background publish's); no backend: no swap phases
IN_LINE = tuple(p for p in PHASES if p != "launch")
TRAINER_PHASES = IN_LINE[: IN_LINE.index("moments") + 1]


def test_a_version_records_prints_and_logs_where_its_time_went(
    make_database, tiny_model_dir: Path, tmp_path: Path
) -> None:
    db_url = make_database()
    upgrade(db_url)
    engine = make_sync_engine(db_url)
    with sync_session_factory(engine)() as db, db.begin():
        store_model(db, MODEL_NAME, [], model_path=str(tiny_model_dir), replace=False)
    rewarded_sessions(engine, [1.0, -1.0, 0.5, -0.5])
    lines: list[str] = []
    settings = gateway_settings(db_url).model_copy(update={"home": tmp_path})
    config = TrainerConfig(lr=1e-3, batch_sessions=16, minibatches=2)  # two: a proximal pass
    trainer = OnlineTrainer(settings, engine, MODEL_NAME, config, log=lines.append)
    try:
        report = trainer.step()
    finally:
        trainer.close()
    assert report is not None and report.version == 1 and report.samples == 4, lines
    assert report.swaps == []

    phases = report.metrics["phases"]
    assert tuple(phases) == TRAINER_PHASES  # every one timed, in order; no swap phases
    assert all(seconds > 0 for seconds in phases.values()), phases
    step_s = report.metrics["step_s"]
    assert 0 < sum(phases.values()) <= step_s
    for moved in ("proximal_s", "forward_backward_s", "optimizer_s"):
        assert moved not in report.metrics  # in the phases, not beside them

    with Session(engine) as db:  # noted on the version's row after the swap
        row = db.scalar(select(PolicyVersion.metrics).where(PolicyVersion.version == 1))
    assert row["phases"] == pytest.approx(phases) and row["step_s"] == pytest.approx(step_s)
    engine.dispose()

    progress = next(i for i, line in enumerate(lines) if line.startswith("[train] v1 "))
    line = lines[progress + 1]  # right after the progress line
    assert line.startswith("[phases] v1  claim ")
    assert line.split()[2:-2:2] == list(TRAINER_PHASES)
    assert line.endswith(f"  (other {other_seconds(phases, step_s):.2f}s)")

    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    events = accumulator.EventAccumulator(str(tmp_path / "runs" / MODEL_NAME))
    events.Reload()
    for name, seconds in phases.items():
        assert [(e.step, e.value) for e in events.Scalars(f"phase/{name}")] == [
            (1, pytest.approx(seconds))
        ]
    (other,) = events.Scalars("phase/other")
    assert other.value == pytest.approx(other_seconds(phases, step_s), abs=1e-6)
