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
