"""TrainerConfig's compute fields: defaults, and refusals that say what to set instead."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.config import TrainerConfig


def test_compute_defaults() -> None:
    config = TrainerConfig()
    assert (config.device, config.dtype) == ("auto", "float32")
    assert config.max_tokens_per_microbatch == 8192 and config.gradient_checkpointing is False
    assert config.as_dict()["max_tokens_per_microbatch"] == 8192


@pytest.mark.parametrize(
    "fields, says",
    [
        ({"device": "gpu"}, "'auto' (CUDA when available, else cpu), 'cpu' or 'cuda'"),
        ({"dtype": "float16"}, "'float32' or 'bfloat16'"),
        ({"max_tokens_per_microbatch": 1024}, "Raise max_tokens_per_microbatch, or lower"),
    ],
)
def test_bad_compute_settings_are_refused_with_the_alternative(fields, says) -> None:
    with pytest.raises(ValueError, match=says.replace("(", r"\(").replace(")", r"\)")):
        TrainerConfig(**fields)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_without_a_device_is_refused() -> None:
    with pytest.raises(ValueError, match="torch sees no CUDA device; set 'auto' or 'cpu'"):
        TrainerConfig(device="cuda")


def test_a_smaller_sample_limit_allows_a_smaller_micro_batch() -> None:
    config = TrainerConfig(max_tokens_per_sample=512, max_tokens_per_microbatch=512)
    assert config.max_tokens_per_microbatch == 512


def test_the_learning_rate_defaults_per_mode_and_is_recorded_resolved() -> None:
    full, lora = TrainerConfig(), TrainerConfig(lora_rank=8)
    assert (full.learning_rate, lora.learning_rate) == (1e-5, 1e-3)
    assert full.as_dict()["lr"] == 1e-5 and lora.as_dict()["lr"] == 1e-3
    assert TrainerConfig(lr=3e-4, lora_rank=8).as_dict()["lr"] == 3e-4
    assert "lr=1e-05" in full.describe() and "lr_warmup_steps=4" in full.describe()


def test_warmup_rises_linearly_to_the_peak_then_holds() -> None:
    config = TrainerConfig(lr=1e-4, lr_warmup_steps=4)
    assert [config.lr_at(s) for s in (1, 2, 3, 4, 9)] == pytest.approx(
        [2.5e-5, 5e-5, 7.5e-5, 1e-4, 1e-4]
    )
    assert TrainerConfig(lr=1e-4, lr_warmup_steps=0).lr_at(1) == 1e-4
    with pytest.raises(ValueError, match="lr must be > 0"):
        TrainerConfig(lr=0.0)


def test_the_step_count_of_the_schedule_survives_a_restart_of_the_moments() -> None:
    from trainer.loop.update import steps_done

    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1.0)
    assert steps_done(optimizer) == 0
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    assert steps_done(optimizer) == 1
    restored = torch.optim.AdamW(model.parameters(), lr=1.0)
    restored.load_state_dict(optimizer.state_dict())  # as a restart restores the moments
    assert steps_done(restored) == 1


def reference_lr_factor(step, warmup, schedule, decay_steps, min_ratio):
    """Written from the definition: linear warmup to 1 over `warmup` steps, then a decay from 1
    to min_ratio over the next `decay_steps` steps (linear or half a cosine), then flat."""
    factor = step / warmup if warmup and step < warmup else 1.0
    if schedule == "constant":
        return factor
    t = min(max(step - warmup, 0), decay_steps) / decay_steps
    shape = 1 - t if schedule == "linear" else (1 + math.cos(math.pi * t)) / 2
    return factor * (min_ratio + (1 - min_ratio) * shape)


@pytest.mark.parametrize("schedule", ["constant", "linear", "cosine"])
def test_the_learning_rate_schedule_follows_its_definition(schedule) -> None:
    config = TrainerConfig(
        lr=1e-4, lr_warmup_steps=3, lr_schedule=schedule, lr_decay_steps=10, lr_min_ratio=0.1
    )
    for step in range(1, 20):
        want = 1e-4 * reference_lr_factor(step, 3, schedule, 10, 0.1)
        assert config.lr_at(step) == pytest.approx(want, rel=1e-12), step
    if schedule != "constant":
        assert config.lr_at(13) == pytest.approx(1e-5) and config.lr_at(50) == pytest.approx(1e-5)
        assert config.lr_at(3) == 1e-4  # the peak, where warmup ends and decay begins


def test_the_objectives_defaults_are_todays_behaviour() -> None:
    config = TrainerConfig()
    assert (config.baseline, config.singleton_baseline, config.overlong) == (
        "group",
        "none",
        "keep",
    )
    assert not config.filter_zero_variance and config.epochs == 1
    assert config.clip_high == config.clip_eps == 0.2
    assert (config.imp_weight_mode, config.imp_weight_level, config.imp_weight_floor) == (
        "truncate",
        "token",
        0.0,
    )
    assert config.lr_schedule == "constant" and config.lr_at(100) == config.learning_rate


@pytest.mark.parametrize(
    "fields, says",
    [
        ({"baseline": "mean"}, "baseline must be one of group, rloo"),
        ({"singleton_baseline": "ema"}, "singleton_baseline must be one of none, task_mean"),
        ({"overlong": "drop"}, "overlong must be one of keep, mask, penalize"),
        ({"imp_weight_level": "batch"}, "imp_weight_level must be one of token, sequence"),
        ({"lr_schedule": "step"}, "lr_schedule must be one of constant, linear, cosine"),
        ({"imp_weight_floor": 0.5}, "truncation has no lower bound"),
        ({"imp_weight_floor": 1.0, "imp_weight_mode": "mask"}, "imp_weight_floor must be in"),
        ({"overlong_penalty": -1.0}, "overlong_penalty must be a finite number >= 0"),
        ({"epochs": 0}, "epochs"),
        ({"clip_eps_high": 0.0}, "clip_eps_high must be in"),
        ({"lr_min_ratio": 1.5}, "lr_min_ratio in"),
    ],
)
def test_bad_objective_settings_are_refused(fields, says) -> None:
    with pytest.raises(ValueError, match=says):
        TrainerConfig(**fields)
