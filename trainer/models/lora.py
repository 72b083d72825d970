"""LoRA on the trainer's side (peft): wrap a model with the adapter being trained, read a stored
adapter back onto its base, and merge one into full weights. (A model's training mode is settled
with its versions: `settle_mode` in trainer/publishing/versions.py.)

The base weights stay frozen (version 0's, on every backend); only the adapter's A and B
matrices are trained, and each version stores the whole adapter (not a difference), so any
version is its base plus one adapter folder.
"""

from __future__ import annotations

from pathlib import Path

import torch

from rlgw.adapters import LoraSpec

from ..config import TrainerConfig


def is_adapted(model: torch.nn.Module) -> bool:
    from peft import PeftModel

    return isinstance(model, PeftModel)


def with_adapter(model: torch.nn.Module, spec: LoraSpec) -> torch.nn.Module:
    """`model` with a new adapter of `spec` (B = 0: it computes what the base does), or `model`
    itself when it already carries one."""
    if is_adapted(model):
        return model
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=spec.rank,
        lora_alpha=spec.alpha,
        target_modules=list(spec.targets) if spec.targets else None,
        lora_dropout=0.0,  # the objective's log-probs must be the served ones: no dropout
        bias="none",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


def load_adapter(model: torch.nn.Module, adapter_dir: str | Path) -> torch.nn.Module:
    """The base `model` with the stored adapter on top, trainable (a version's reference)."""
    from peft import PeftModel

    return PeftModel.from_pretrained(model, str(adapter_dir), is_trainable=True).eval()


def merged(model: torch.nn.Module) -> torch.nn.Module:
    """Plain transformers weights: an adapted model's adapter merged into its base."""
    return model.merge_and_unload() if is_adapted(model) else model


def adapter_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The trainable adapter tensors, by parameter name."""
    return {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}


@torch.no_grad()
def copy_adapter(source: torch.nn.Module, target: torch.nn.Module) -> None:
    """Copy the adapter of `source` (on any device) into `target` of the same config."""
    params = dict(target.named_parameters())
    for name, value in adapter_state(source).items():
        params[name].copy_(value.to(params[name].device, params[name].dtype))


def spec_of(config: TrainerConfig) -> LoraSpec | None:
    if not config.lora_rank:
        return None
    targets = tuple(config.lora_targets) if config.lora_targets else None
    return LoraSpec(config.lora_rank, config.lora_alpha or 2.0 * config.lora_rank, targets)
