"""bench/trainer_step.py at its smallest (tiny preset, one timed step): the real trainer claims the
sessions the benchmark wrote in the recorded format, commits a version per step, and the report
holds the whole step, the raw step on the same tokens and the delta's size."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_whole_step_benchmark_trains_the_recorded_sessions(pg_admin_uri: str, tmp_path: Path):
    pg = pg_admin_uri.split("?")[0].rsplit("/", 1)[0]
    out = tmp_path / "trainer_step.json"
    done = subprocess.run(
        [sys.executable, "bench/trainer_step.py", "--preset", "tiny", "--steps", "1"]
        + ["--dtypes", "float32", "--pg", pg, "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (result,) = json.loads(out.read_text())["results"]
    (step,) = result["steps"]
    assert result["swap"] is False and result["tokens_per_step"] == 2 * 256
    assert step["whole_s"] > step["train_s"] > 0 and step["raw_s"] > 0
    assert step["bytes"] > 90_000 * 4  # a delta of every parameter of the tiny model, fp32
    assert "| float32 | excluded |" in done.stdout
