"""Where and in what precision the update runs: the device, the autocast context, the model's prep.

Master weights and AdamW state stay float32 on every dtype; `bfloat16` is autocast for the forward
(and so the backward) only. Why: bf16 keeps 8 significant bits, so adding an update smaller than
about 2^-9 of a weight's magnitude rounds it away. docs/training.md has the numbers.
"""

from __future__ import annotations

import contextlib

import torch

from ..config import TrainerConfig
from .scoring import scoring_mode


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """'auto' -> cuda when torch sees a device, else cpu; 'cuda' -> this process's GPU."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        return torch.device("cuda", local_rank)
    return torch.device(name)


def autocast(device: torch.device, dtype: str) -> contextlib.AbstractContextManager:
    """bf16 autocast for dtype 'bfloat16' (matmuls in bf16, reductions kept fp32); else nothing."""
    if dtype == "bfloat16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


# CPU flags of native bf16 arithmetic (AVX-512 BF16, AMX). Without them torch converts to fp32 and
# back around every bf16 op: on this project's AMD EPYC VM (AVX2 only) a bench-0.5b update step
# in bf16 took ~8 minutes against ~30 s in fp32 (docs/benchmarks.md, trainer throughput).
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def cpu_flags() -> frozenset[str] | None:
    """The CPU's feature flags from /proc/cpuinfo (Linux); None where they cannot be read."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


def slow_bf16_warning(
    device: torch.device, dtype: str, flags: frozenset[str] | None = None
) -> str | None:
    """A warning when bf16 is asked for on a CPU without native bf16 arithmetic; None otherwise
    (a GPU, fp32, or flags that cannot be read)."""
    if dtype != "bfloat16" or device.type != "cpu":
        return None
    flags = cpu_flags() if flags is None else flags
    if flags is None or flags & NATIVE_BF16_FLAGS:
        return None
    return (
        "--dtype bfloat16 on a CPU without native bf16 (no avx512_bf16 or amx_bf16 flag): torch "
        "emulates it, far slower than float32 here; use --dtype float32 on this machine"
    )


def model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def prepare_model(
    model: torch.nn.Module, config: TrainerConfig, device: torch.device | None = None
) -> torch.nn.Module:
    """Move the model to its device with fp32 master weights; activation checkpointing if asked.

    Call before creating the optimizer (or loading its state) and before `shard_model`.
    """
    device = device or resolve_device(config.device)
    model.to(device=device, dtype=torch.float32)
    scoring_mode(model)  # dropout off, the LM head in fp32 under autocast (trainer/loop/scoring.py)
    if config.gradient_checkpointing:
        # Non-reentrant checkpointing: works with FSDP2 and with frozen (LoRA) base weights.
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def check_placement(model: torch.nn.Module, config: TrainerConfig) -> torch.device:
    """The model's device, if it is the one the config asks for; a ValueError saying how if not."""
    have, want = model_device(model), resolve_device(config.device)
    if have.type != want.type:
        raise ValueError(
            f"the model is on {have} but device={config.device!r} resolves to {want}: call "
            "trainer.loop.device.prepare_model(model, config) before creating the optimizer"
        )
    return have
