"""The trainer's configuration: one dataclass, recorded with every policy version it produces."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TrainerConfig:
    # data
    batch_sessions: int = 8  # sessions (whole groups count together) claimed per update
    min_sessions: int = 1  # an update waits until at least this many are eligible
    max_staleness: int = 4  # versions a completion may lag behind the current one (AReaL's eta)
    max_tokens_per_sample: int = 2048  # longer samples are skipped with a reason
    # objective: decoupled PPO (Fu et al. 2025, AReaL, eq. 5)
    clip_eps: float = 0.2  # PPO clip range on pi_theta / pi_prox (Schulman et al. 2017: 0.2)
    imp_weight_cap: float = 5.0  # truncation of pi_prox / pi_behave (AReaL's behav_imp_weight_cap)
    imp_weight_mode: str = "truncate"  # truncate: min(w, cap) | mask: drop tokens with w > cap
    # optimisation
    lr: float = 1e-3  # AdamW learning rate
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float = 1.0  # max global grad norm
    minibatches: int = 1  # optimizer steps per version, over disjoint slices of the batch
    # weight sync
    anchor_every: int = 10  # every N-th version ships full weights instead of a delta
    seed: int = 0

    def __post_init__(self) -> None:
        if self.imp_weight_mode not in ("truncate", "mask"):
            raise ValueError("imp_weight_mode must be 'truncate' (min(w, cap)) or 'mask'")
        if not 0 < self.clip_eps < 1:
            raise ValueError("clip_eps must be in (0, 1); PPO's usual value is 0.2")
        if self.imp_weight_cap < 1:
            raise ValueError("imp_weight_cap below 1 would down-weight on-policy tokens; use >= 1")
        if self.minibatches < 1 or self.batch_sessions < 1 or self.anchor_every < 1:
            raise ValueError("minibatches, batch_sessions and anchor_every must be >= 1")
        if self.min_sessions > self.batch_sessions:
            raise ValueError("min_sessions cannot exceed batch_sessions")

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
