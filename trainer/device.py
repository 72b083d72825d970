"""Where and in what precision the update runs: the device, the autocast context, the model's prep.

Master weights and AdamW state stay float32 on every dtype; `bfloat16` is autocast for the forward
(and so the backward) only. Why: bf16 keeps 8 significant bits, so adding an update smaller than
about 2^-9 of a weight's magnitude rounds it away. docs/training.md has the numbers.
"""

from __future__ import annotations

import contextlib

import torch

from .config import TrainerConfig


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
            "trainer.device.prepare_model(model, config) before creating the optimizer"
        )
    return have
