"""The trainer's command-line flags, one per `TrainerConfig` field (trainer/config.py), so that a
field added there is a flag of every command that registers these (`rlgw train` today).

Each flag defaults to None: only the flags given override the config's defaults.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from trainer.config import TrainerConfig

# Help beyond the field's name, where the flag's form needs saying.
HELP = {
    "betas": "AdamW betas: two floats, e.g. --betas 0.9 0.999",
    "lora_targets": "with --lora-rank: comma-separated module names to adapt, e.g. "
    "q_proj,k_proj,v_proj,o_proj (default: peft's for the family: q_proj,v_proj for "
    "Qwen2 and Llama)",
    "gradient_checkpointing": "recompute activations in the backward pass: less memory, ~30%% "
    "more compute",
}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_trainer_flags(parser: argparse.ArgumentParser) -> None:
    """Add one flag per TrainerConfig field to `parser`, typed after the field's annotation."""
    for field in dataclasses.fields(TrainerConfig):
        flag = _flag(field.name)
        help_text = HELP.get(field.name, f"TrainerConfig.{field.name} (see trainer/config.py)")
        kind = str(field.type)  # the annotation as written (the module has lazy annotations)
        if kind == "bool":
            parser.add_argument(flag, action="store_true", default=None, help=help_text)
        elif kind.startswith("tuple[str"):  # a comma-separated list
            parser.add_argument(flag, default=None, metavar="NAMES", help=help_text)
        elif kind.startswith("tuple[float"):
            parser.add_argument(flag, type=float, nargs=2, metavar="X", help=help_text)
        else:  # int, float, str, or one of them | None
            scalar = {"int": int, "float": float, "str": str}[kind.split(" |")[0]]
            parser.add_argument(flag, type=scalar, default=None, help=help_text)


def trainer_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The TrainerConfig fields given on the command line (`add_trainer_flags`), as keyword
    arguments for TrainerConfig."""
    given: dict[str, Any] = {}
    for field in dataclasses.fields(TrainerConfig):
        value = getattr(args, field.name, None)
        if value is None:
            continue
        if str(field.type).startswith("tuple[str"):
            if not value:  # an empty list: the config's default
                continue
            value = tuple(value.split(","))
        elif str(field.type).startswith("tuple["):
            value = tuple(value)
        given[field.name] = value
    return given
