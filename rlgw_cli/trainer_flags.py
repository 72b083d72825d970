"""The trainer's options, set the same way for `rlgw train`, `rlgw up` and `rlgw demo`: one flag
per `TrainerConfig` field (trainer/config.py), so that a field added there is a flag of every
command that registers these, and `--trainer-config FILE` (TOML, the same field names) for all of
them. Precedence: the config's defaults, then the file, then the flags given.

Each flag defaults to None: only the flags given override the file and the defaults. A command
whose own flag has the same name (`rlgw up --dtype` is the served weights' dtype, `--seed` the
preset's) registers the trainer flags without those (`skip`); the file still sets them.
"""

from __future__ import annotations

import argparse
import dataclasses
import tomllib
from pathlib import Path
from typing import Any

from trainer.config import CHOICES, TrainerConfig

# Help beyond the field's name, where the flag's form needs saying.
HELP = {
    "betas": "AdamW betas: two floats, e.g. --betas 0.9 0.999",
    "lora_targets": "with --lora-rank: comma-separated module names to adapt, e.g. "
    "q_proj,k_proj,v_proj,o_proj (default: peft's for the family: q_proj,v_proj for "
    "Qwen2 and Llama)",
    "gradient_checkpointing": "recompute activations in the backward pass: less memory, ~30%% "
    "more compute",
    "packing": "micro-batches: on (rows end to end in lines, attention kept within each row), "
    "off (one padded row per line), auto (docs/training.md, 'Packed micro-batches')",
    "join_turns": "a session's turns as one sequence while each extends the last (default on); "
    "--no-join-turns: one sample per turn (docs/training.md)",
}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_trainer_flags(parser: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
    """Add `--trainer-config FILE` and one flag per TrainerConfig field (but `skip`) to `parser`,
    typed after the field's annotation."""
    parser.add_argument(
        "--trainer-config",
        default=None,
        metavar="FILE",
        help="a TOML file of trainer options (TrainerConfig's field names, e.g. lr = 2e-5); "
        "flags given on the command line win (docs/training.md)",
    )
    for field in dataclasses.fields(TrainerConfig):
        if field.name in skip:
            continue
        flag = _flag(field.name)
        help_text = HELP.get(field.name, f"TrainerConfig.{field.name} (see trainer/config.py)")
        kind = str(field.type)  # the annotation as written (the module has lazy annotations)
        if kind == "bool":  # --x and --no-x: a field that defaults to True can be turned off
            parser.add_argument(
                flag, action=argparse.BooleanOptionalAction, default=None, help=help_text
            )
        elif kind.startswith("tuple[str"):  # a comma-separated list
            parser.add_argument(flag, default=None, metavar="NAMES", help=help_text)
        elif kind.startswith("tuple[float"):
            parser.add_argument(flag, type=float, nargs=2, metavar="X", help=help_text)
        elif field.name in CHOICES:  # a string of a fixed set: argparse names them on a typo
            parser.add_argument(flag, choices=CHOICES[field.name], default=None, help=help_text)
        else:  # int, float, str, or one of them | None
            scalar = {"int": int, "float": float, "str": str}[kind.split(" |")[0]]
            parser.add_argument(flag, type=scalar, default=None, help=help_text)


def trainer_file(path: str | Path) -> dict[str, Any]:
    """The options of a `--trainer-config` TOML file; ValueError naming an unknown key."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"--trainer-config {path}: {exc}") from None
    known = {f.name for f in dataclasses.fields(TrainerConfig)}
    if unknown := sorted(set(data) - known):
        raise ValueError(
            f"--trainer-config {path}: unknown option(s) {', '.join(unknown)} "
            f"(TrainerConfig's fields: {', '.join(sorted(known))})"
        )
    return {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}


def trainer_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The TrainerConfig fields set by `--trainer-config` and the flags given on the command
    line (`add_trainer_flags`; the flags win), as keyword arguments for TrainerConfig."""
    path = getattr(args, "trainer_config", None)
    given: dict[str, Any] = trainer_file(path) if path else {}
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


def trainer_argv(args: argparse.Namespace, skip: tuple[str, ...] = ()) -> list[str]:
    """The trainer flags given to this command (but `skip`), as arguments for a child
    `rlgw train` (`rlgw up` starts one): the file as it was named, then each flag given."""
    argv = (
        ["--trainer-config", str(Path(args.trainer_config).resolve())]
        if args.trainer_config
        else []
    )
    for field in dataclasses.fields(TrainerConfig):
        value = getattr(args, field.name, None)
        if field.name in skip or value is None:
            continue
        if isinstance(value, bool):  # --x, or --no-x (given: it overrides the file)
            argv.append(_flag(field.name) if value else "--no-" + _flag(field.name)[2:])
        elif isinstance(value, list | tuple):
            argv += [_flag(field.name), *map(str, value)]
        else:
            argv += [_flag(field.name), str(value)]
    return argv
