"""`rlgw export-model`: any recorded version as a complete Hugging Face checkpoint (the base model
with its deltas, full files or adapters applied in order), which transformers and vLLM load like
the original: config, generation config, tokenizer and chat template, safetensors weights."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from sqlalchemy import Engine, select
from sqlalchemy.orm import sessionmaker

from rlgw.db.models import RegisteredModel

from ..errors import TrainerError, UnknownModel, database_errors
from ..models.lora import merged
from .versions import latest_version, materialize

# Everything of the base directory that is not weights: tokenizer, templates, generation config.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class ExportError(TrainerError):
    """The version cannot be exported (no such version, an existing directory, ...)."""


def export_model(
    engine: Engine,
    model_name: str,
    version: int | None,
    out_dir: Path,
    *,
    dtype: str = "float32",
    max_shard_size: str = "5GB",
    overwrite: bool = False,
    log=print,
) -> Path:
    """Write `version` (default: the latest) of `model_name` to `out_dir`; returns it."""
    if dtype not in DTYPES:
        raise ExportError(f"dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()) and not overwrite:
        raise ExportError(f"{out_dir} is not empty (pass --overwrite to replace it)")
    with database_errors(), sessionmaker(engine)() as db:
        model = db.scalar(select(RegisteredModel).where(RegisteredModel.name == model_name))
        if model is None:
            raise UnknownModel(model_name)
        latest = latest_version(db, model.id)
        version = latest if version is None else version
        if not 0 <= version <= latest:
            raise ExportError(f"{model_name} has versions 0 to {latest}, not {version}")
        log(f"[export-model] rebuilding {model_name} version {version}")
        weights = merged(materialize(db, model, version))  # a LoRA version: adapter merged in
        base = Path(model.path)
    if out_dir.exists() and overwrite:
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for item in base.iterdir():  # tokenizer, chat template, generation config, ...
        if item.is_file() and not item.name.endswith(WEIGHT_SUFFIXES + WEIGHT_INDEXES):
            shutil.copy2(item, out_dir / item.name)
    weights.to(DTYPES[dtype]).save_pretrained(
        out_dir, safe_serialization=True, max_shard_size=max_shard_size
    )
    provenance = {"model": model_name, "version": version, "base": str(base), "dtype": dtype}
    (out_dir / "rlgw_export.json").write_text(json.dumps(provenance, indent=2) + "\n")
    log(f"[export-model] wrote {out_dir} ({model_name} version {version}, {dtype})")
    return out_dir
