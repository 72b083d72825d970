"""bench/gpu_check.py, the GPU proof, runs here on the CPU with tiny shapes and says what it did."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULT_KEYS = {
    "name", "model", "mode", "lora_rank", "dtype", "fsdp2", "gradient_checkpointing", "params",
    "trainable_params", "samples_per_step", "tokens_per_step", "output_tokens_per_step",
    "microbatches_per_step", "max_tokens_per_microbatch", "steps_measured", "step_s",
    "tokens_per_s", "model_tflop_per_step", "achieved_tflop_per_s", "peak_tflop_per_s", "mfu",
    "peak_memory_gib", "version_write", "metrics", "raw_step_s", "raw_tokens_per_s", "whole_s",
    "whole_over_raw", "packed", "padding_frac",
}  # fmt: skip


def gpu_check(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--device", "cpu", "--quick", *args],
        env={**os.environ, "PYTHONPATH": str(ROOT), "OUT": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    report = json.loads(run.stdout)
    assert json.loads((tmp_path / "gpu_check.json").read_text()) == report
    return run, report


def test_gpu_check_runs_every_configuration_on_the_cpu(tmp_path: Path) -> None:
    pytest.importorskip("peft")
    _, report = gpu_check(tmp_path)
    assert {"device", "torch", "transformers", "peft", "total_s", "results", "skipped"} <= set(
        report
    )
    assert report["skipped"] == []
    assert report["weight_transfer"]["bitwise_equal"] is True  # NcclTransfer's packing, on gloo
    results = {r["name"]: r for r in report["results"]}
    assert set(results) == {
        "tiny/full/bfloat16", "tiny/lora8/bfloat16", "tiny/lora64/bfloat16",
        "tiny/full/bfloat16/fsdp2", "tiny/full/bfloat16/ckpt", "tiny/lora64/float32",
        "tiny/full/float32", "tiny-llama/full/bfloat16", "tiny-llama/lora8/bfloat16",
    }  # fmt: skip
    for name, result in results.items():
        assert set(result) == RESULT_KEYS, name
        assert result["tokens_per_s"] > 0 and result["microbatches_per_step"] > 1, name
        assert result["version_write"]["bytes"] > 0, name
        # whole = the update step + the version's write: never faster than the step alone
        assert result["whole_s"] >= sum(result["step_s"]) / len(result["step_s"]), name
        assert result["whole_over_raw"] == pytest.approx(
            sum(result["raw_step_s"]) / len(result["raw_step_s"]) / result["whole_s"]
        ), name
        assert result["metrics"]["ratio_mean"] == 1.0, name
    assert results["tiny/lora8/bfloat16"]["version_write"]["kind"] == "lora adapter folder"
    full = results["tiny/full/float32"]["version_write"]
    assert full["kind"] == "delta safetensors (bfloat16)"  # as the trainer ships it
    assert set(full["phases"]) == {"gather", "delta", "write", "checksum"}
    # the default model's architecture, scaled down: Llama with tied embeddings
    llama = results["tiny-llama/full/bfloat16"]
    assert llama["params"] == llama["trainable_params"]
    # the raw step is timed on the update's own layout: packed for a transformers Llama
    assert llama["packed"] is True and 0 <= llama["padding_frac"] < 1
    assert results["tiny-llama/lora8/bfloat16"]["version_write"]["kind"] == "lora adapter folder"
    lora = results["tiny/lora8/bfloat16"]
    assert lora["trainable_params"] < lora["params"]
    # FSDP2 over one rank is the same update as no FSDP.
    fsdp, plain = results["tiny/full/bfloat16/fsdp2"], results["tiny/full/bfloat16"]
    assert fsdp["metrics"] == pytest.approx(plain["metrics"], rel=1e-6)


def test_max_seconds_skips_what_would_not_fit_and_says_so(tmp_path: Path) -> None:
    _, report = gpu_check(tmp_path, "--max-seconds", "0")
    assert report["results"] == [] and len(report["skipped"]) == 9
    assert all("--max-seconds 0" in s["reason"] for s in report["skipped"])


def test_the_weight_transfer_check_packs_broadcasts_and_unpacks_bit_for_bit() -> None:
    run = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "weight_transfer_check.py"),
            "--device",
            "cpu",
            "--quick",
            "--buffer-bytes",
            "40000",
        ],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    report = json.loads(run.stdout)
    assert report["backend"] == "gloo" and report["bitwise_equal"] is True
    assert report["buckets"] > 1  # 40 kB buckets: the tiny model's 230 kB are cut
    assert report["bytes"] > 0 and report["tensors"] > 0
