"""Two trainer processes (FSDP2 over gloo; a LoRA policy replicated with DDP) make the same update
as one; a dead rank fails the step.

Each test starts two CPU processes with the tiny model (~20 s on two cores)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlgw.ports import free_port

sys.path.insert(0, str(Path(__file__).resolve().parent / "unit"))
from update_fixtures import (  # noqa: E402
    PAD_ID,
    assert_same_update,
    interleaved_samples,
    tiny_model,
    weights,
)

from trainer.config import TrainerConfig  # noqa: E402
from trainer.loop.distributed import DistContext  # noqa: E402
from trainer.loop.update import policy_update  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "distributed_worker.py"
# As tests/unit/test_update.py: the two ranks' gradient halves are summed in another order than
# one process sums them (measured ~5e-7 of a tensor's largest step), plus one ulp of each weight.
RTOL = 2e-6


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def single_process_update() -> tuple[dict, dict, dict]:
    """(weights, metrics, momentum buffers by name) of the same update in this process."""
    sys.path.insert(0, str(WORKER.parent))
    from distributed_worker import CONFIG, OPTIMIZER

    model = tiny_model()
    optimizer = torch.optim.SGD(model.parameters(), **OPTIMIZER)
    config = TrainerConfig(**CONFIG)
    metrics = policy_update(model, optimizer, interleaved_samples(), config, PAD_ID)
    buffers = {n: optimizer.state[p]["momentum_buffer"] for n, p in model.named_parameters()}
    return weights(model), metrics, buffers


def torchrun(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--master-port", str(free_port()), str(WORKER), *args],
        env=env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_two_processes_make_the_single_process_update(tmp_path: Path) -> None:
    """Rank 1 starts from other weights and receives rank 0's (load_full_state) first."""
    out = tmp_path / "out"
    run = torchrun("--out", str(out))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "[rank 1] 1 of 6 micro-batches" in run.stdout  # rank 1 ran 5 empty ones to keep up
    gathered = load_file(str(out / "weights.safetensors"))
    expected, metrics, buffers = single_process_update()
    assert_same_update(gathered, expected, weights(tiny_model()), RTOL)
    # The optimizer state gathers whole too (SGD's momentum buffer is the first gradient).
    momentum = load_file(str(out / "momentum.safetensors"))
    assert momentum.keys() == buffers.keys()
    for name, buffer in buffers.items():
        torch.testing.assert_close(momentum[name], buffer, rtol=1e-5, atol=1e-9, msg=name)
    distributed = json.loads((out / "metrics.json").read_text())
    for key in ("loss", "grad_norm", "tokens", "kl_behave"):
        assert distributed[key] == pytest.approx(metrics[key], rel=1e-6), key


def test_two_processes_train_a_lora_policy_as_one_and_stay_replicas(tmp_path: Path) -> None:
    """Rank 1 starts from other base weights and another adapter and gets rank 0's (DDP); the
    adapter's gradients are averaged, rank 0's moments are saved and restored on every rank."""
    sys.path.insert(0, str(WORKER.parent))
    from distributed_worker import lora_policy

    out = tmp_path / "out"
    run = torchrun("--out", str(out), "--lora")
    assert run.returncode == 0, run.stdout + run.stderr
    single = lora_policy(0, DistContext(0, 1, 0, torch.device("cpu")))
    trainable = single.reference.named_parameters()
    before = {n: p.detach().clone() for n, p in trainable if p.requires_grad}
    single.update(interleaved_samples())
    metrics = single.update(interleaved_samples())
    expected = single.weights()
    ranks = [load_file(str(out / f"adapter-{r}.safetensors")) for r in range(2)]
    assert ranks[0].keys() == expected.keys() and all("lora_" in n for n in expected)
    assert all(torch.equal(ranks[0][n], ranks[1][n]) for n in expected)  # replicas, bitwise
    assert_same_update(ranks[0], expected, before, RTOL)
    assert any(not torch.equal(expected[n], before[n]) for n in expected)  # it did train
    moments = [load_file(str(out / f"moments-{r}.safetensors")) for r in range(2)]
    assert moments[0].keys() == moments[1].keys() and len(moments[0]) == len(expected)
    assert all(torch.equal(moments[0][k], moments[1][k]) for k in moments[0])
    assert any(bool(m.abs().sum() > 0) for m in moments[1].values())  # rank 0's, not zeros
    distributed = json.loads((out / "metrics.json").read_text())
    for key in ("loss", "grad_norm", "tokens"):
        assert distributed[key] == pytest.approx(metrics[key], rel=1e-6), key


def launch_pair(args: list[str], timeout_s: float) -> list[subprocess.CompletedProcess]:
    """Two ranks started as torchrun would (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_*), each
    watched on its own, so that the survivor's own error is seen (torchrun would kill it).
    Rank 0 is awaited first; rank 1 is killed if it is still running once rank 0 has ended."""
    port = str(free_port())
    torchrun_env = {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), *args],
            env={**env(), **torchrun_env, "RANK": str(r), "LOCAL_RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    results = []
    try:
        for proc, wait_s in zip(procs, (timeout_s, 10), strict=True):
            try:
                stdout, stderr = proc.communicate(timeout=wait_s)
            except subprocess.TimeoutExpired:  # still running: a hung rank
                proc.kill()
                stdout, stderr = proc.communicate()
            results.append(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results


def test_a_rank_that_dies_mid_step_fails_the_step_on_the_others(tmp_path: Path) -> None:
    out = tmp_path / "out"
    rank0, rank1 = launch_pair(["--out", str(out), "--crash-rank", "1", "--timeout-s", "30"], 240)
    assert rank1.returncode == 17  # the injected death, during its first forward
    assert rank0.returncode != 0, rank0.stdout + rank0.stderr
    assert "Error" in rank0.stderr  # the survivor raised: its peer is gone
    assert not (out / "committed").exists() and not (out / "weights.safetensors").exists()


def test_torchrun_fails_when_a_rank_dies(tmp_path: Path) -> None:
    out = tmp_path / "out"
    run = torchrun("--out", str(out), "--crash-rank", "1", "--timeout-s", "30")
    assert run.returncode != 0 and "exitcode  : 17" in run.stderr
    assert not (out / "committed").exists()


def test_a_rank_that_hangs_fails_the_step_after_the_group_timeout(tmp_path: Path) -> None:
    out = tmp_path / "out"
    started = time.monotonic()
    rank0, _ = launch_pair(["--out", str(out), "--hang-rank", "1", "--timeout-s", "10"], 240)
    waited = time.monotonic() - started
    assert rank0.returncode != 0, rank0.stdout + rank0.stderr
    assert "timed out" in rank0.stderr.lower() or "timeout" in rank0.stderr.lower()
    assert not (out / "committed").exists()
    assert waited < 120, f"rank 0 gave up after {waited:.0f}s (timeout 10 s + start-up)"
