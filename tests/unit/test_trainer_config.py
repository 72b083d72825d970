"""TrainerConfig's compute fields: defaults, and refusals that say what to set instead."""

from __future__ import annotations

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
    assert (full.learning_rate, lora.learning_rate) == (1e-5, 1e-4)
    assert full.as_dict()["lr"] == 1e-5 and lora.as_dict()["lr"] == 1e-4
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
