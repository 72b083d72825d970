"""Commands on models: create a local one, serve one with vLLM."""

from __future__ import annotations

import argparse
from pathlib import Path

from rlgw.backend_launcher import AUTO, run_backend_foreground
from rlgw.db.engine import make_sync_engine
from rlgw.model_dir import check_servable, inspect_model_dir
from rlgw.settings import Settings
from rlgw.tool_parsers import choose_tool_parser

from .database import ready_database_url
from .output import CommandError, info
from .train import trainer_errors

# A real pretrained instruct model (trainer/models/pretrained.py).
DEFAULT_MODEL = "smollm2-135m-instruct"
RANDOM_PRESETS = ["tiny", "small", "bench-0.5b"]  # random local models, for tests and benchmarks
PRESETS = [DEFAULT_MODEL, *RANDOM_PRESETS]


def user_model(model_dir: str, name: str | None) -> tuple[Path, str]:
    """The user's checkpoint, checked before anything starts, and the name it is served as."""
    model = inspect_model_dir(model_dir)
    notice = check_servable(model)
    if notice:
        info(f"[rlgw] {notice}")
    info(f"[rlgw] model {model.path} ({model.architecture}, {model.dtype_on_disk or '?'} on disk)")
    return model.path, name or model.path.name


def preset_model(settings: Settings, preset: str, seed: int) -> tuple[Path, str]:
    """A preset's model under RLGW_HOME, made on first use: the pretrained default (a link to
    the shared cache, converted once), or a local random model of a preset."""
    if preset not in RANDOM_PRESETS:
        from trainer.models.pretrained import PRETRAINED, install_pretrained

        link = settings.home / "models" / preset
        return install_pretrained(link, PRETRAINED[preset], log=info), preset
    from trainer.models.init_model import create_model  # here for start-up time: it imports torch

    name = f"{preset}-seed{seed}"
    model_dir = settings.home / "models" / name
    if not (model_dir / "config.json").exists():
        create_model(model_dir, preset=preset, seed=seed)
    return model_dir, name


def tool_parser_arg(value: str) -> str | None:
    """--tool-call-parser: a vLLM parser name, "auto" (the model family's) or "none"."""
    return None if value == "none" else value


def add_model_flags(p: argparse.ArgumentParser) -> None:
    """The flags `rlgw up` and `rlgw backend` share for serving a model."""
    p.add_argument(
        "--dtype",
        choices=["float32", "bfloat16"],
        default=None,
        help="weights in vLLM (default: float32 on the CPU, bfloat16 on a GPU)",
    )
    p.add_argument(
        "--tool-call-parser",
        default=AUTO,
        help="vLLM tool-call parser: auto (the one the checkpoint's tokenizer and chat template "
        "support: hermes, llama3_json or mistral; none when none fits), none, or a vLLM parser "
        "name (refused before vLLM starts when the checkpoint cannot support it)",
    )


def cmd_init_model(args: argparse.Namespace) -> int:
    from trainer.models.init_model import create_model

    if args.preset not in RANDOM_PRESETS:  # the pretrained model: a link to the shared cache
        from trainer.models.pretrained import PRETRAINED, PretrainedError, install_pretrained

        try:
            install_pretrained(Path(args.out), PRETRAINED[args.preset], log=info)
        except PretrainedError as exc:
            raise CommandError(str(exc), code=1) from None
        return 0
    try:
        create_model(
            Path(args.out),
            preset=args.preset,
            seed=args.seed,
            overwrite=args.overwrite,
            family=args.family,
            tokenizer=args.tokenizer,
            dtype=args.dtype,
            max_shard_size=args.max_shard_size,
        )
    except (ValueError, FileExistsError) as exc:
        raise CommandError(str(exc), code=2) from None
    return 0


def cmd_backend(args: argparse.Namespace) -> int:
    model_dir, name = user_model(args.model, args.name)
    tools = choose_tool_parser(model_dir, tool_parser_arg(args.tool_call_parser))
    if tools.notice:
        info(f"[rlgw] {tools.notice}")
    return run_backend_foreground(
        model_dir,
        args.port,
        log_path=Settings().home / "logs" / f"vllm-{args.port}.log",
        host=args.host,
        served_model_name=name,
        platform=args.platform,
        dtype=args.dtype,
        tool_call_parser=tools.parser,
        lora_rank=args.max_lora_rank,
    )


def cmd_export_model(args: argparse.Namespace) -> int:
    from trainer.publishing.export_model import (
        export_model,  # here for start-up time: it imports torch
    )

    engine = make_sync_engine(ready_database_url(Settings()))
    try:
        with trainer_errors():
            export_model(
                engine,
                args.model,
                args.version,
                Path(args.out),
                dtype=args.dtype,
                overwrite=args.overwrite,
                log=info,
            )
    finally:
        engine.dispose()
    return 0


def add_commands(add) -> None:
    p = add(
        "init-model",
        cmd_init_model,
        f"Make a model directory: {DEFAULT_MODEL} (a real pretrained instruct model, fetched "
        "and converted once into a shared cache; --out becomes a link to it) or a small random "
        "model (Qwen2, Qwen3 or Llama).",
    )
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--preset", default="tiny", choices=PRESETS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overwrite", action="store_true", help="replace an existing model")
    p.add_argument("--family", default="qwen2", choices=["qwen2", "qwen3", "llama"])
    p.add_argument(
        "--tokenizer",
        default=None,
        choices=["byte", "bpe"],
        help="byte (the default for qwen2) or a BPE tokenizer trained here (the others')",
    )
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="on disk")
    p.add_argument("--max-shard-size", default=None, help="e.g. 2GB: write sharded safetensors")

    p = add(
        "export-model",
        cmd_export_model,
        "Write a recorded version as a complete Hugging Face checkpoint (transformers, vLLM).",
    )
    p.add_argument("--model", required=True, help="registered model name")
    p.add_argument("--version", type=int, default=None, help="default: the latest")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty directory")

    p = add("backend", cmd_backend, "Run a vLLM server for a model with the flags rlgw needs.")
    p.add_argument("--model", required=True, help="model directory")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--name", default=None, help="served model name (default: directory name)")
    p.add_argument("--platform", choices=["cpu", "gpu"], default=None, help="default: detect")
    p.add_argument(
        "--max-lora-rank",
        type=int,
        default=None,
        metavar="R",
        help="for a model trained with LoRA (rlgw train --lora-rank R): serve run-time adapters "
        "up to rank R (--enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING)",
    )
    add_model_flags(p)
