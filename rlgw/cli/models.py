"""Commands on models: create a local one, serve one with vLLM."""

from __future__ import annotations

import argparse
from pathlib import Path

from rlgw.backend_launcher import run_backend_foreground

PRESETS = ["tiny", "small", "bench-0.5b"]


def cmd_init_model(args: argparse.Namespace) -> int:
    from trainer.init_model import create_model

    create_model(Path(args.out), preset=args.preset, seed=args.seed, overwrite=args.overwrite)
    return 0


def cmd_backend(args: argparse.Namespace) -> int:
    return run_backend_foreground(
        args.model, args.port, host=args.host, served_model_name=args.name, platform=args.platform
    )


def add_commands(add) -> None:
    p = add("init-model", cmd_init_model, "Write a Qwen2-architecture model with a byte tokenizer.")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--preset", default="tiny", choices=PRESETS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overwrite", action="store_true", help="replace an existing model")

    p = add("backend", cmd_backend, "Run a vLLM server for a model with the flags rlgw needs.")
    p.add_argument("--model", required=True, help="model directory")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--name", default=None, help="served model name (default: directory name)")
    p.add_argument("--platform", choices=["cpu", "gpu"], default=None, help="default: detect")
