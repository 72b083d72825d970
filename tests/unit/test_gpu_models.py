"""bench/gpu_models.py builds the default model's architecture as its converted checkpoint does."""

from __future__ import annotations

import json

import pytest
import torch

from bench.gpu_models import SIZES, SMOLLM2_135M, Run, build
from trainer.models.pretrained import SMOLLM2, cache_root


def test_the_embedded_config_is_the_converted_checkpoints() -> None:
    path = cache_root() / f"{SMOLLM2.name}-{SMOLLM2.version}" / "config.json"
    if not path.is_file():
        pytest.skip(f"the default model was never converted here ({path} is absent)")
    recorded = json.loads(path.read_text())
    recorded["rope_theta"] = recorded.get("rope_parameters", {}).get("rope_theta")
    assert recorded["architectures"] == ["LlamaForCausalLM"]
    assert {k: recorded.get(k) for k in SMOLLM2_135M} == SMOLLM2_135M


def test_the_scaled_down_llama_is_built_tied_like_the_default_model() -> None:
    model = build(Run(SIZES["quick-llama"], "full", "bfloat16"), torch.device("cpu"), 0)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.get_input_embeddings().weight is model.get_output_embeddings().weight
    assert next(model.parameters()).dtype == torch.float32
