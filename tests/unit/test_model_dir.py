"""A user's model directory is checked before anything starts: one clear reason when it cannot
be served and trained."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlgw.model_dir import ModelDirError, inspect_model_dir


def make_dir(
    root: Path,
    *,
    config: dict | None = None,
    weights: bool = True,
    tokenizer: bool = True,
) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    if config is not None:
        (root / "config.json").write_text(json.dumps(config))
    if weights:
        (root / "model.safetensors").write_bytes(b"")
    if tokenizer:
        (root / "tokenizer.json").write_text("{}")
    return root


QWEN = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "torch_dtype": "bfloat16",
    "max_position_embeddings": 32768,
}


def test_a_causal_lm_directory_is_described(tmp_path: Path) -> None:
    model = inspect_model_dir(make_dir(tmp_path / "m", config=QWEN))
    assert model.architecture == "Qwen2ForCausalLM" and model.model_type == "qwen2"
    assert model.dtype_on_disk == "bfloat16" and model.max_positions == 32768


@pytest.mark.parametrize(
    ("build", "words"),
    [
        (lambda p: p / "missing", "no model directory"),
        (lambda p: make_dir(p / "m"), "has no config.json"),
        (
            lambda p: make_dir(p / "m", config={"architectures": ["BertForMaskedLM"]}),
            "not a causal language model",
        ),
        (lambda p: make_dir(p / "m", config=QWEN, weights=False), "no safetensors weights"),
        (lambda p: make_dir(p / "m", config=QWEN, tokenizer=False), "has no tokenizer"),
    ],
)
def test_a_directory_that_cannot_be_served_says_why_in_one_line(tmp_path: Path, build, words):
    with pytest.raises(ModelDirError) as refused:
        inspect_model_dir(build(tmp_path))
    assert words in str(refused.value) and "\n" not in str(refused.value)
