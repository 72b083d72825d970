"""The trainer's configuration: one dataclass, recorded with every policy version it produces."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from rlgw.sequences import DEFAULT_LIMITS

# AdamW's peak learning rate when none is set, per mode. Full weights at 1e-5 took the real
# default model (SmolLM2-135M-Instruct) from 0.20 to 0.67 held-out success in 25 minutes on
# 2 cores, where the old default (1e-3, chosen for a random 90k-parameter model) wrecked it in two
# versions; the peers' 1e-6 (TRL's GRPO, verl) is tuned for far larger models and batches.
# LoRA (rank 8) at 1e-4 hardly moved the model in 30 minutes (+0.038, KL to the base 0.0004 per
# token); at 1e-3 it gained +0.494 (KL 0.33, general chat shorter but fluent): 100x full weights.
# docs/training.md, "Defaults for pretrained weights".
LR_DEFAULTS = {"full": 1e-5, "lora": 1e-3}
DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("float32", "bfloat16")
# The objective's options (docs/training.md, "Objective"): the accepted values of each.
BASELINES = ("group", "rloo")  # a group's advantage: its own normalization | leave-one-out
SINGLETON_BASELINES = ("none", "task_mean", "batch_mean")  # a session without a group
OVERLONG = ("keep", "mask", "penalize")  # a completion cut by max_tokens (finish "length")
IMP_WEIGHT_MODES = ("truncate", "mask")
IMP_WEIGHT_LEVELS = ("token", "sequence")
LR_SCHEDULES = ("constant", "linear", "cosine")
PACKING = ("auto", "on", "off")  # micro-batches: see `packing` below
# The string fields with a fixed set of values (the CLI offers them as its flags' choices).
CHOICES = {
    "device": DEVICES,
    "dtype": DTYPES,
    "delta_dtype": DTYPES,
    "imp_weight_mode": IMP_WEIGHT_MODES,
    "imp_weight_level": IMP_WEIGHT_LEVELS,
    "baseline": BASELINES,
    "singleton_baseline": SINGLETON_BASELINES,
    "overlong": OVERLONG,
    "lr_schedule": LR_SCHEDULES,
    "packing": PACKING,
}


@dataclass(frozen=True)
class TrainerConfig:
    # data
    # sessions claimed per update: whole ready groups while they fit (one larger group alone)
    batch_sessions: int = 32
    min_sessions: int = 1  # an update waits until at least this many are eligible
    # The five settings that decide a session's sequences take their defaults from
    # rlgw/sequences.py (DEFAULT_LIMITS), which the gateway's training view uses too.
    # versions a completion may lag behind the current one (AReaL's eta)
    max_staleness: int = DEFAULT_LIMITS.max_staleness
    max_tokens_per_sample: int = DEFAULT_LIMITS.max_tokens_per_sample  # longer: skipped, a reason
    # a session's turns as one sequence while each extends the last (rlgw/sequences.py);
    # False: every turn a sample of its own, its whole history as its prompt
    join_turns: bool = DEFAULT_LIMITS.join_turns
    # objective: decoupled PPO (Fu et al. 2025, AReaL, eq. 5)
    clip_eps: float = 0.2  # PPO clip range on pi_theta / pi_prox (Schulman et al. 2017: 0.2)
    clip_eps_high: float | None = None  # upper clip (DAPO's clip-higher); None: clip_eps
    epochs: int = 1  # passes over the batch per version (each pass: `minibatches` steps)
    imp_weight_cap: float = 5.0  # truncation of pi_prox / pi_behave (AReaL's behav_imp_weight_cap)
    imp_weight_mode: str = "truncate"  # truncate: min(w, cap) | mask: drop tokens with w > cap
    imp_weight_floor: float = 0.0  # mask: also drop tokens with w < floor (IcePop / MIS)
    imp_weight_level: str = "token"  # token | sequence: drop samples by the geometric mean of w
    # advantages (docs/training.md, "Advantages and baselines")
    baseline: str = "group"  # a group: group (its own normalization) | rloo (leave-one-out)
    singleton_baseline: str = "none"  # no group: none (raw) | task_mean | batch_mean
    # cut by max_tokens: keep | mask (skip) | penalize (DAPO)
    overlong: str = DEFAULT_LIMITS.overlong
    # with overlong=penalize: subtracted from the advantage
    overlong_penalty: float = DEFAULT_LIMITS.overlong_penalty
    filter_zero_variance: bool = False  # drop groups whose members' returns are all equal (DAPO)
    # optimisation
    lr: float | None = None  # AdamW peak learning rate; None: LR_DEFAULTS for the mode
    lr_warmup_steps: int = 4  # optimizer steps of linear warmup from lr / N up to lr (0: none)
    lr_schedule: str = "constant"  # after warmup: constant | linear | cosine decay
    lr_decay_steps: int = 1000  # optimizer steps of decay after warmup (linear, cosine)
    lr_min_ratio: float = 0.0  # the decay ends at lr * lr_min_ratio, and stays there
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float = 1.0  # max global grad norm
    minibatches: int = 1  # optimizer steps per version, over disjoint slices of the batch
    # compute (docs/training.md, "Device, precision and memory")
    device: str = "auto"  # auto: CUDA when torch sees a device, else cpu | cpu | cuda
    dtype: str = "float32"  # bfloat16: autocast forward/backward; master weights, AdamW stay fp32
    max_tokens_per_microbatch: int = 8192  # padded tokens (lines x longest) per forward/backward
    # on: samples packed end to end in lines no longer than the micro-batch's longest sample,
    # attention kept within each (trainer/loop/packing.py) | off: one sample per padded line |
    # auto: on (measured faster on the CPU too: docs/benchmarks.md); a model that cannot pack pads
    packing: str = "auto"
    # packed lines compute a prefix that several rows share (a group's prompt, a system prompt)
    # once, each row's own tokens attending to it (trainer/loop/prefix_sharing.py), where the
    # model's attention takes a 4D mask (sdpa, eager) and the saving outweighs the mask's cost
    share_prefixes: bool = True
    gradient_checkpointing: bool = False  # recompute activations in backward: less memory, +~30%
    # LoRA (docs/training.md, "LoRA"): train a peft adapter instead of every weight
    lora_rank: int = 0  # 0: full weights; R: each version is an adapter of rank R (peft's r)
    lora_alpha: float | None = None  # peft's lora_alpha; None: 2 * lora_rank
    lora_targets: tuple[str, ...] | None = None  # module names; None: peft's for the family
    # weight sync
    anchor_every: int = 10  # every N-th version ships full weights instead of a delta
    # record and push a version in the background while the next update computes (at most one
    # in flight); never colocated, gated or with native transfer (docs/training.md)
    overlap_publish: bool = True
    delta_dtype: str = "bfloat16"  # a delta's stored dtype; the reference adopts it (exact parity)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.imp_weight_mode not in IMP_WEIGHT_MODES:
            raise ValueError("imp_weight_mode must be 'truncate' (min(w, cap)) or 'mask'")
        if not 0 < self.clip_eps < 1:
            raise ValueError("clip_eps must be in (0, 1); PPO's usual value is 0.2")
        if self.clip_eps_high is not None and not 0 < self.clip_eps_high < 10:
            raise ValueError("clip_eps_high must be in (0, 10) (DAPO: 0.28); unset: clip_eps")
        if self.imp_weight_cap < 1:
            raise ValueError("imp_weight_cap below 1 would down-weight on-policy tokens; use >= 1")
        self._check_objective()
        if self.lr is not None and not self.lr > 0:
            raise ValueError("lr must be > 0 (leave it unset for the mode's default)")
        if self.lr_warmup_steps < 0:
            raise ValueError("lr_warmup_steps must be >= 0 (0: no warmup)")
        if min(self.minibatches, self.epochs, self.batch_sessions, self.anchor_every) < 1:
            raise ValueError("minibatches, epochs, batch_sessions and anchor_every must be >= 1")
        if self.min_sessions > self.batch_sessions:
            raise ValueError("min_sessions cannot exceed batch_sessions")
        self._check_compute()
        if self.lora_rank < 0 or (self.lora_rank == 0 and (self.lora_alpha or self.lora_targets)):
            raise ValueError("lora_alpha and lora_targets need lora_rank >= 1 (0: full weights)")
        if self.lora_rank:
            from rlgw.adapters import LoraSpec

            LoraSpec(self.lora_rank, self.lora_alpha or 2.0 * self.lora_rank)  # its checks

    def _check_objective(self) -> None:
        choices = (
            ("imp_weight_level", IMP_WEIGHT_LEVELS),
            ("baseline", BASELINES),
            ("singleton_baseline", SINGLETON_BASELINES),
            ("overlong", OVERLONG),
            ("lr_schedule", LR_SCHEDULES),
            ("packing", PACKING),
        )
        for name, allowed in choices:
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"{name} must be one of {', '.join(allowed)}, not {getattr(self, name)!r}"
                )
        if not 0 <= self.imp_weight_floor < 1:
            raise ValueError("imp_weight_floor must be in [0, 1) (IcePop: 0.5; 0: no floor)")
        if (
            self.imp_weight_floor > 0
            and self.imp_weight_mode == "truncate"
            and self.imp_weight_level == "token"
        ):
            raise ValueError(
                "imp_weight_floor masks tokens (imp_weight_mode='mask') or samples "
                "(imp_weight_level='sequence'); truncation has no lower bound"
            )
        if not (math.isfinite(self.overlong_penalty) and self.overlong_penalty >= 0):
            raise ValueError("overlong_penalty must be a finite number >= 0")
        if self.lr_decay_steps < 1 or not 0 <= self.lr_min_ratio <= 1:
            raise ValueError("lr_decay_steps must be >= 1 and lr_min_ratio in [0, 1]")

    def _check_compute(self) -> None:
        if self.device not in DEVICES:
            raise ValueError(
                f"device must be 'auto' (CUDA when available, else cpu), 'cpu' or 'cuda', "
                f"not {self.device!r}"
            )
        if self.device == "cuda":
            import torch  # here, not at import: the config is read where torch may be absent

            if not torch.cuda.is_available():
                raise ValueError("device='cuda' but torch sees no CUDA device; set 'auto' or 'cpu'")
        if self.dtype not in DTYPES:
            raise ValueError(
                f"dtype must be 'float32' or 'bfloat16' (autocast; weights stay fp32), "
                f"not {self.dtype!r}"
            )
        if self.delta_dtype not in DTYPES:
            raise ValueError(f"delta_dtype must be one of {DTYPES}, not {self.delta_dtype!r}")
        if self.max_tokens_per_microbatch < self.max_tokens_per_sample:
            raise ValueError(
                f"max_tokens_per_microbatch ({self.max_tokens_per_microbatch}) is below "
                f"max_tokens_per_sample ({self.max_tokens_per_sample}): a sample that long would "
                "fit no micro-batch. Raise max_tokens_per_microbatch, or lower "
                "max_tokens_per_sample (longer samples are skipped with a reason)"
            )

    @property
    def learning_rate(self) -> float:
        """The peak learning rate: `lr`, or the mode's default (full weights or LoRA)."""
        return self.lr if self.lr is not None else LR_DEFAULTS["lora" if self.lora_rank else "full"]

    def warmup_factor(self, step: int) -> float:
        """The fraction of the peak learning rate at optimizer step `step` (counted from 1 over
        the whole run): linear warmup over `lr_warmup_steps`, then 1."""
        if self.lr_warmup_steps and step < self.lr_warmup_steps:
            return step / self.lr_warmup_steps
        return 1.0

    def decay_factor(self, step: int) -> float:
        """The schedule's factor after warmup: 1 (constant), or a linear or cosine decay from 1
        to `lr_min_ratio` over the `lr_decay_steps` steps that follow the warmup, then flat."""
        if self.lr_schedule == "constant":
            return 1.0
        progress = min(max(step - self.lr_warmup_steps, 0) / self.lr_decay_steps, 1.0)
        if self.lr_schedule == "linear":
            shape = 1.0 - progress
        else:  # cosine (Loshchilov & Hutter 2017, without restarts)
            shape = 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.lr_min_ratio + (1.0 - self.lr_min_ratio) * shape

    def lr_factor(self, step: int) -> float:
        """The fraction of the peak learning rate at optimizer step `step` (from 1)."""
        return self.warmup_factor(step) * self.decay_factor(step)

    def lr_at(self, step: int) -> float:
        """The learning rate of optimizer step `step`."""
        return self.learning_rate * self.lr_factor(step)

    @property
    def clip_high(self) -> float:
        """The upper clip range: `clip_eps_high`, or `clip_eps` when unset."""
        return self.clip_eps if self.clip_eps_high is None else self.clip_eps_high

    def as_dict(self) -> dict[str, Any]:
        """The effective configuration (the learning rate resolved), as recorded with versions."""
        return {**dataclasses.asdict(self), "lr": self.learning_rate}

    def describe(self) -> str:
        """One line for the start of a run: every field, as it is in force."""
        return " ".join(f"{k}={v}" for k, v in self.as_dict().items())
