"""`rlgw train` (the online trainer as a service) and `rlgw push` (install weights by hand)."""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from rlgw.db.engine import make_sync_engine
from rlgw.placement import Placement
from rlgw.ports import free_port
from rlgw.settings import Settings

from .database import ready_database_url
from .output import CommandError, info
from .placement import add_placement_flags, placement_from
from .trainer_flags import add_trainer_flags, trainer_overrides


def cmd_train(args: argparse.Namespace) -> int:
    if args.nproc > 1 and "RANK" not in os.environ:
        return run_under_torchrun(args)
    placement = placement_from(args)
    pin_trainer(placement)  # before the heavy imports start threads
    from trainer.config import TrainerConfig
    from trainer.loop.service import OnlineTrainer

    settings = Settings()
    try:
        config = TrainerConfig(**trainer_overrides(args))
    except ValueError as exc:  # the config says what to set instead
        raise CommandError(str(exc), code=2) from None
    rank0 = os.environ.get("RANK", "0") == "0"  # the other ranks never open the database
    engine = make_sync_engine(ready_database_url(settings)) if rank0 else None
    try:
        with trainer_errors():
            trainer = OnlineTrainer(
                settings,
                engine,
                args.model,
                config,
                placement=placement,
                wandb_project=args.wandb,
            )
        try:
            with trainer_errors():
                trainer.run(poll_s=args.poll_s, max_versions=args.max_versions)
        except KeyboardInterrupt:
            info("[train] stopped")
        finally:
            trainer.close()
    finally:
        if engine is not None:
            engine.dispose()
    return 0


def run_under_torchrun(args: argparse.Namespace) -> int:
    """`rlgw train --nproc N ...` again, as N ranks under torchrun (this process waits)."""
    import torch  # here for start-up time

    nproc = args.nproc
    cuda = args.device != "cpu" and torch.cuda.is_available()
    have = torch.cuda.device_count() if cuda else len(os.sched_getaffinity(0))
    if nproc > have:
        what = "CUDA devices" if cuda else "CPUs"
        raise CommandError(f"--nproc {nproc}: this machine has {have} {what}", code=2)
    argv = [a for a in args.argv if not a.startswith("--nproc=")]
    if "--nproc" in argv:  # "--nproc N": its value goes too
        i = argv.index("--nproc")
        argv = argv[:i] + argv[i + 2 :]
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc)]
    command += ["--master-port", str(free_port()), "-m", "rlgw_cli", *argv]
    info(f"[train] {nproc} processes: {' '.join(command[2:])}")
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    return subprocess.run(command, env=env).returncode


@contextlib.contextmanager
def trainer_errors() -> Iterator[None]:
    """The trainer's expected failures (trainer/errors.py) as one line: a wrong model name, bad
    weights, a version that does not exist or a push past a promotion gate are usage errors
    (exit 2), the rest exit 1."""
    from trainer.errors import BadUpdate, GatedModel, LoraMismatch, TrainerError, UnknownModel
    from trainer.publishing.export_model import ExportError

    try:
        yield
    except TrainerError as exc:
        usage = UnknownModel | BadUpdate | ExportError | GatedModel | LoraMismatch
        code = 2 if isinstance(exc, usage) else 1
        raise CommandError(str(exc), code=code) from None


def pin_trainer(placement: Placement) -> None:
    """A separated trainer runs on its own cores, with torch's threads to match."""
    import torch  # here for start-up time

    placement.pin("trainer")
    if (threads := placement.trainer_threads()) is not None:
        torch.set_num_threads(threads)
    info(f"[train] placement {placement.describe()}, {torch.get_num_threads()} torch threads")


def cmd_push(args: argparse.Namespace) -> int:
    from trainer.publishing.push import push

    settings = Settings()
    with trainer_errors():
        reports = push(
            settings,
            ready_database_url(settings),
            args.model,
            delta=Path(args.delta) if args.delta else None,
            full_dir=Path(args.full) if args.full else None,
        )
    return 0 if reports and all(r.outcome == "swapped" for r in reports) else 1


def add_commands(add) -> None:
    p = add("push", cmd_push, "Install new weights on every backend of a model, verified.")
    p.add_argument("--model", required=True, help="registered model name")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--delta", help="safetensors file of theta_new - theta_served (HF names)")
    what.add_argument("--full", help="checkpoint directory with the new weights")

    p = add("train", cmd_train, "Run the online trainer for a model until stopped.")
    p.add_argument("--model", required=True, help="registered model name")
    p.add_argument("--max-versions", type=int, default=None, help="stop after N versions")
    p.add_argument("--poll-s", type=float, default=0.5, help="wait between empty polls")
    add_trainer_flags(p)
    p.add_argument(
        "--wandb",
        default=None,
        metavar="PROJECT",
        help="also log each version to this Weights & Biases project (needs `pip install "
        "wandb`); TensorBoard event files are always written under RLGW_HOME/runs/MODEL",
    )
    p.add_argument(
        "--nproc",
        type=int,
        default=1,
        help="train with N processes (FSDP2 over torch.distributed: gloo on CPU, nccl on GPUs); "
        "rank 0 claims, commits and pushes. The same as running under torchrun",
    )
    add_placement_flags(p)
