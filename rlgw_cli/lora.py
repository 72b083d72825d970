"""The LoRA flags of `rlgw up` and the training mode it settles before anything starts: the
backend needs the LoRA flags when the model is trained with adapters, and the trainer the same
adapter settings as the model's versions were made with."""

from __future__ import annotations

import argparse

from sqlalchemy import select

from rlgw.adapters import LoraSpec
from rlgw.db.engine import make_sync_engine, sync_session_factory
from rlgw.db.models import RegisteredModel

from .output import CommandError


def add_lora_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--lora-rank",
        type=int,
        default=None,
        help="train LoRA adapters of this rank (peft) instead of every weight; the backend "
        "starts with run-time adapters (default: full weights, or the model's recorded mode)",
    )
    p.add_argument("--lora-alpha", type=float, default=None, help="peft lora_alpha (default 2R)")
    p.add_argument(
        "--lora-targets",
        default=None,
        metavar="NAMES",
        help="comma-separated module names to adapt (default: peft's for the family)",
    )


def lora_mode(database_url: str, model: str, args: argparse.Namespace) -> LoraSpec | None:
    """The adapter settings `model` trains with: the flags', agreed with the mode its trained
    versions record (a model without flags keeps its own); a disagreement is a usage error."""
    from trainer.config import TrainerConfig  # here for start-up time: the trainer imports torch
    from trainer.errors import LoraMismatch
    from trainer.models.lora import spec_of
    from trainer.publishing.versions import settle_mode

    targets = tuple(args.lora_targets.split(",")) if args.lora_targets else None
    try:
        config = TrainerConfig(
            lora_rank=args.lora_rank or 0, lora_alpha=args.lora_alpha, lora_targets=targets
        )
    except ValueError as exc:
        raise CommandError(str(exc), code=2) from None
    engine = make_sync_engine(database_url)
    try:
        with sync_session_factory(engine)() as db, db.begin():
            row = db.scalar(select(RegisteredModel).where(RegisteredModel.name == model))
            if row is not None:
                config = settle_mode(db, row, config)
    except LoraMismatch as exc:
        raise CommandError(str(exc), code=2) from None
    finally:
        engine.dispose()
    return spec_of(config)


def lora_argv(spec: LoraSpec | None) -> list[str]:
    """The `rlgw train` flags of `spec`."""
    if spec is None:
        return []
    argv = ["--lora-rank", str(spec.rank), "--lora-alpha", repr(spec.alpha)]
    return argv + (["--lora-targets", ",".join(spec.targets)] if spec.targets else [])
