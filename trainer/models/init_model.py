"""Create a small, randomly initialised model: by default Qwen2 with a byte-level tokenizer.

`create_model(..., family="qwen3" | "llama", tokenizer="bpe")` builds the other families with a
BPE tokenizer trained locally (trainer/models/model_families.py); `dtype="bfloat16"` and
`max_shard_size` write the checkpoint in bf16 and in shards, as hub checkpoints come.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from . import model_families
from .byte_model import (  # re-exported: the byte-level model is the default one
    PRESETS,
    VOCAB_SIZE,
    ModelShape,
    build_model,
    build_tokenizer,
    generation_config,
    save_tokenizer,
)


def _ensure_empty(out_dir: Path, overwrite: bool) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise FileExistsError(f"{out_dir} exists and is not a directory")
    if out_dir.is_dir() and any(out_dir.iterdir()):
        if not overwrite:
            raise FileExistsError(f"{out_dir} is not empty (pass overwrite=True to replace it)")
        for old in out_dir.iterdir():
            if old.is_file() and (old.suffix in {".safetensors", ".json", ".jinja", ".txt"}):
                old.unlink()
    out_dir.mkdir(parents=True, exist_ok=True)


def _dir_size_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file()) / 1e6


TOKENIZERS = ("byte", "bpe")
CHECKPOINT_DTYPES = ("float32", "bfloat16")


def create_model(
    out_dir: Path | str,
    preset: str = "tiny",
    seed: int = 0,
    *,
    overwrite: bool = False,
    family: str = "qwen2",
    tokenizer: str | None = None,
    dtype: str = "float32",
    max_shard_size: str | int | None = None,
) -> Path:
    """Write a random model (safetensors), its tokenizer and generation config to out_dir.

    family: qwen2 (default) | qwen3 | llama. tokenizer: "byte" (259 ids, ChatML: qwen2's default,
    also fits qwen3) or "bpe" (trained here; the default for the other families). dtype: the
    checkpoint's dtype on disk (weights are drawn in fp32 either way). max_shard_size (e.g.
    "200KB", "2GB"): split the weights into shards with a model.safetensors.index.json.
    The defaults write the same bytes as always.
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
    fam = model_families.family(family)
    tokenizer = tokenizer or ("byte" if family == "qwen2" else "bpe")
    if tokenizer not in TOKENIZERS:
        raise ValueError(f"tokenizer must be one of {TOKENIZERS}, not {tokenizer!r}")
    if tokenizer == "byte" and not fam.chatml:
        raise ValueError(f"the byte tokenizer is ChatML; family {family!r} needs tokenizer='bpe'")
    if dtype not in CHECKPOINT_DTYPES:
        raise ValueError(f"dtype must be one of {CHECKPOINT_DTYPES}, not {dtype!r}")
    out_dir = Path(out_dir)
    _ensure_empty(out_dir, overwrite)
    shape = PRESETS[preset]

    print(f"[init-model] building {tokenizer} tokenizer", flush=True)
    tok, model = _build(fam, tokenizer, shape, seed)
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"[init-model] initialised {n_params:,} parameters "
        f"({family}, preset {preset}, seed {seed})",
        flush=True,
    )
    _save_weights(model, out_dir, dtype, max_shard_size)
    _generation_config(model.config).save_pretrained(out_dir)
    save_tokenizer(tok, out_dir, fam.chat_template)
    _write_provenance(out_dir, preset, seed, family=family, tokenizer=tokenizer, dtype=dtype)
    _make_readable(out_dir)
    print(f"[init-model] saved to {out_dir} ({_dir_size_mb(out_dir):.1f} MB)", flush=True)
    return out_dir


def _build(fam, tokenizer: str, shape: ModelShape, seed: int):
    """(tokenizer, model): the original byte-level Qwen2 exactly as before, or a family's."""
    if fam.name == "qwen2" and tokenizer == "byte":
        return build_tokenizer(shape.max_position_embeddings), build_model(shape, seed)
    if tokenizer == "byte":
        tok = build_tokenizer(shape.max_position_embeddings)
    else:
        tok = model_families.build_bpe_tokenizer(fam, shape.max_position_embeddings)
    config = model_families.build_config(fam, shape, len(tok), model_families.token_ids(fam, tok))
    return tok, model_families.build_model(fam, config, seed)


def _save_weights(model, out_dir: Path, dtype: str, max_shard_size: str | int | None) -> None:
    import torch

    if dtype == "bfloat16":
        model = model.to(torch.bfloat16)
    extra = {"max_shard_size": max_shard_size} if max_shard_size is not None else {}
    model.save_pretrained(out_dir, safe_serialization=True, **extra)


def _generation_config(config):
    """The default model's generation config as before; another family's from its own ids."""
    from transformers import GenerationConfig

    if config.model_type == "qwen2" and config.vocab_size == VOCAB_SIZE:
        return generation_config()
    return GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    )


def _make_readable(out_dir: Path) -> None:
    """transformers writes safetensors 0600; a server in a container may run as another user."""
    for path in out_dir.iterdir():
        if path.is_file():
            path.chmod(0o644)


def _write_provenance(out_dir: Path, preset: str, seed: int, **build: str) -> None:
    info = {"preset": preset, "seed": seed, **build, "fingerprint": model_fingerprint(out_dir)}
    (out_dir / "rlgw_model.json").write_text(json.dumps(info, indent=2) + "\n")


def model_fingerprint(model_dir: Path | str) -> str:
    """sha256 over the model's safetensors files (names and bytes, in sorted order)."""
    digest = hashlib.sha256()
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors files in {model_dir}")
    for path in files:
        digest.update(path.name.encode() + b"\0")
        with path.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--overwrite", action="store_true")
    parser.add_argument("--family", default="qwen2", choices=["qwen2", "qwen3", "llama"])
    parser.add_argument("--tokenizer", default=None, choices=list(TOKENIZERS))
    parser.add_argument("--dtype", default="float32", choices=list(CHECKPOINT_DTYPES))
    parser.add_argument("--max-shard-size", default=None, help='e.g. "2GB"; default: one file')
    args = parser.parse_args(argv)
    create_model(
        args.out_dir,
        args.preset,
        args.seed,
        overwrite=args.overwrite,
        family=args.family,
        tokenizer=args.tokenizer,
        dtype=args.dtype,
        max_shard_size=args.max_shard_size,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
