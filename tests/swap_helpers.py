"""Helpers for the weight-swap tests: random deltas and adapters, reference models, log-prob
recomputation."""

from __future__ import annotations

from pathlib import Path

import torch

from trainer.models.weights import apply_delta, load_reference_model, state_dict, write_update


def random_delta(model_dir: Path, seed: int, scale: float = 0.02) -> dict[str, torch.Tensor]:
    """A delta on every parameter, large enough that every served log-prob moves visibly."""
    generator = torch.Generator().manual_seed(seed)
    base = state_dict(load_reference_model(model_dir))
    return {
        name: torch.randn(value.shape, generator=generator) * scale for name, value in base.items()
    }


def write_delta(delta: dict[str, torch.Tensor], path: Path) -> Path:
    write_update(delta, path)
    return path


def random_adapter(model_dir: Path, rank: int, seed: int) -> torch.nn.Module:
    """The base model with a random (non-zero) LoRA adapter of `rank`: a peft model, whose
    adapter moves every served log-prob visibly (peft starts B at zero, a no-op)."""
    from rlgw.adapters import LoraSpec
    from trainer.models.lora import with_adapter

    torch.manual_seed(seed)
    model = with_adapter(load_reference_model(model_dir), LoraSpec(rank, 2.0 * rank))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.05)
    return model


def reference_with(model_dir: Path, *deltas: dict[str, torch.Tensor]) -> torch.nn.Module:
    model = load_reference_model(model_dir)
    for delta in deltas:
        apply_delta(model, delta)
    return model


@torch.no_grad()
def output_logprobs(model: torch.nn.Module, prompt: list[int], output: list[int]) -> list[float]:
    """log p(output_j | prompt, output_<j) under `model`: what a backend serving it would record."""
    ids = torch.tensor([prompt + output])  # (1, P+O)
    logprobs = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)  # (P+O, V)
    positions = torch.arange(len(prompt) - 1, len(prompt) + len(output) - 1)
    return logprobs[positions, torch.tensor(output)].tolist()
