"""LoRA training of a model: its adapter settings (`models.lora`) and the name a backend serves
each version under, the one rule the trainer (which loads adapters) and the gateway (which
sends a model's traffic to them) share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# vLLM 0.32 accepts only these values of --max-lora-rank (vllm/config/lora.py: MaxLoRARanks).
VLLM_MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


@dataclass(frozen=True)
class LoraSpec:
    """The adapter a model is trained with (peft LoraConfig's r, lora_alpha, target_modules)."""

    rank: int
    alpha: float
    targets: tuple[str, ...] | None = None  # None: peft's default modules for the architecture

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise ValueError(f"lora rank must be >= 1, not {self.rank}")
        if self.rank > VLLM_MAX_LORA_RANKS[-1]:
            raise ValueError(
                f"lora rank {self.rank} is above vLLM's largest ({VLLM_MAX_LORA_RANKS[-1]})"
            )
        if self.alpha <= 0:
            raise ValueError(f"lora alpha must be > 0, not {self.alpha}")

    def as_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "alpha": self.alpha, "targets": list(self.targets or []) or None}

    @classmethod
    def from_json(cls, value: dict[str, Any] | None) -> LoraSpec | None:
        if not value:
            return None
        targets = value.get("targets")
        return cls(int(value["rank"]), float(value["alpha"]), tuple(targets) if targets else None)


def max_lora_rank(rank: int) -> int:
    """The smallest --max-lora-rank vLLM accepts that holds an adapter of `rank`."""
    for allowed in VLLM_MAX_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ValueError(f"lora rank {rank} is above vLLM's largest ({VLLM_MAX_LORA_RANKS[-1]})")


def served_name(model: str, version: int | None, *, lora: bool) -> str:
    """The model name a backend serves `version` under: the adapter `model@vN` of a LoRA-trained
    model's version N >= 1; the model's own name for its base (0) and for full-weight training."""
    if lora and version:
        return f"{model}@v{version}"
    return model
