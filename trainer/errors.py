"""The trainer's expected failures: each carries one line that says what happened and what to do.

    TrainerError                 catch this in a command: print str(exc), exit 1
    ├── UnknownModel             no model is registered under the name (push, train)
    ├── DatabaseUnavailable      Postgres refused or dropped the connection
    ├── VersionConflict          another publisher recorded a version after the one this update
    │                            was built on (a push while a trainer runs, two pushes at once)
    ├── VersionFilesUnavailable  RLGW_VERSION_FILES_BIND cannot be served (malformed, in use)
    ├── LoraMismatch             the trainer's LoRA settings (or their absence) differ from
    │                            those the model's trained versions were made with
    └── PushError                `rlgw push` did not install the weights (also: a usage error)
        ├── BadUpdate            the weights given cannot become a version (unreadable file,
        │                        unknown names, wrong shapes, NaN); nothing was recorded
        ├── GatedModel           the model has a promotion gate: its versions come through the
        │                        gate (the trainer), never pushed past it; nothing was recorded
        └── PushRefused          the version is recorded and current, but no backend took it
                                 (every backend refused, or none is registered)

Anything else (a bug, a backend leaving its weights in an unknown state mid-swap) is not wrapped.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from sqlalchemy.exc import OperationalError

if TYPE_CHECKING:
    from .swap.coordinator import SwapReport


class TrainerError(RuntimeError):
    """An expected failure of `rlgw train` or `rlgw push`; its message is one line."""


class UnknownModel(TrainerError, LookupError):
    def __init__(self, model_name: str) -> None:
        super().__init__(f"no model named {model_name!r} is registered (see `rlgw register`)")


class LoraMismatch(TrainerError):
    """The trainer's LoRA settings disagree with what the model's versions were trained with."""


class DatabaseUnavailable(TrainerError):
    """Postgres could not be reached, or the connection broke."""


class VersionConflict(TrainerError):
    def __init__(self, model_name: str, parent: int, latest: int) -> None:
        super().__init__(
            f"{model_name} is at version {latest}, but this update was built on version "
            f"{parent}: someone else published meanwhile; start again from version {latest}"
        )


class VersionFilesUnavailable(TrainerError):
    def __init__(self, bind: str, cause: Exception) -> None:
        super().__init__(f"cannot serve version files on RLGW_VERSION_FILES_BIND={bind}: {cause}")


class PushError(TrainerError):
    """`rlgw push` did not install the weights."""


class BadUpdate(PushError):
    """The weights given cannot become a version; nothing was recorded."""


class GatedModel(PushError):
    """The model has a promotion gate; a push would put weights past it."""

    def __init__(self, model_name: str) -> None:
        super().__init__(
            f"{model_name} has a promotion gate: new versions reach it through the gate (rlgw "
            "train), not rlgw push; `rlgw gate clear` first if you mean to bypass it (audited)"
        )


class PushRefused(PushError):
    """The version is recorded and current, but no backend serves it."""

    def __init__(self, model_name: str, version: int, reports: list[SwapReport]) -> None:
        self.version, self.reports = version, reports
        if reports:
            why = "; ".join(
                f"backend {r.backend_id} {r.outcome}: {' '.join(str(r.reason).split())}"
                for r in reports
            )
        else:
            why = f"{model_name} has no backend registered"
        super().__init__(
            f"version {version} of {model_name} is recorded and current, but no backend took it "
            f"({why}); the next push or trainer start brings the backends to it with full "
            "weights (pushing the same delta again would apply it twice)"
        )


@contextlib.contextmanager
def database_errors() -> Iterator[None]:
    """Turn a lost or refused database connection into DatabaseUnavailable (one line)."""
    try:
        yield
    except OperationalError as exc:
        first_line = str(exc.orig or exc).strip().splitlines()[0]
        raise DatabaseUnavailable(f"the database is unavailable: {first_line}") from exc
