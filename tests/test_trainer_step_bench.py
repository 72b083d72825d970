"""bench/trainer_step.py at its smallest (tiny preset, one timed step): the real trainer claims the
sessions the benchmark wrote in the recorded format, commits a version per step, and the report
holds the whole step, the raw step on the same tokens and the delta's size."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("nproc", [1, 2])
def test_whole_step_benchmark_trains_the_recorded_sessions(
    pg_admin_uri: str, tmp_path: Path, nproc: int
):
    """In one process, and in two under torchrun (FSDP2 over gloo: rank 0 claims and commits, both
    ranks take their share of the update and of the raw step)."""
    pg = pg_admin_uri.split("?")[0].rsplit("/", 1)[0]
    out = tmp_path / "trainer_step.json"
    done = subprocess.run(
        [sys.executable, "bench/trainer_step.py", "--preset", "tiny", "--steps", "1"]
        + ["--dtypes", "float32", "--pg", pg, "--out", str(out), "--nproc", str(nproc)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (result,) = json.loads(out.read_text())["results"]
    (step,) = result["steps"]
    assert result["swap"] is False and result["tokens_per_step"] == 2 * 256
    assert result["processes"] == nproc
    assert step["whole_s"] > step["train_s"] > 0 and step["raw_s"] > 0
    # a delta of every parameter of the tiny model, in bf16 (TrainerConfig.delta_dtype's default)
    assert 90_000 * 2 < step["bytes"] < 90_000 * 4
    assert f"| float32 | {nproc} | excluded |" in done.stdout
