"""The --placement flags that `rlgw up`, `rlgw train` and `rlgw demo` share."""

from __future__ import annotations

import argparse

from rlgw.placement import KINDS, Placement

from .output import CommandError


def add_placement_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--placement",
        choices=KINDS,
        default="shared",
        help="where generation and training run: shared (default: both at once, cores as the "
        "OS gives them), separated (both at once on disjoint cores), colocated (time-shared: "
        "generation pauses while the trainer updates)",
    )
    p.add_argument("--trainer-cpus", default=None, help="separated: the trainer's CPUs, e.g. 1")
    p.add_argument(
        "--backend-cpus",
        default=None,
        help="separated: the backends' CPUs, e.g. 0 (default: "
        "the first half of this machine's CPUs to the backends, the rest to the trainer)",
    )


def placement_from(args: argparse.Namespace) -> Placement:
    try:
        return Placement.choose(
            args.placement, trainer_cpus=args.trainer_cpus, backend_cpus=args.backend_cpus
        )
    except ValueError as exc:
        raise CommandError(str(exc), code=2) from None


def placement_argv(placement: Placement) -> list[str]:
    """The flags that give a child `rlgw` process the same placement."""
    argv = ["--placement", placement.kind]
    if placement.trainer_cpus is not None:
        argv += ["--trainer-cpus", ",".join(map(str, sorted(placement.trainer_cpus)))]
    if placement.backend_cpus is not None:
        argv += ["--backend-cpus", ",".join(map(str, sorted(placement.backend_cpus)))]
    return argv
