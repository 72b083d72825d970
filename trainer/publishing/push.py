"""`rlgw push`: install a delta or full weights as a new policy version on every backend."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load_file

from rlgw.db.engine import make_sync_engine
from rlgw.settings import Settings

from ..backends.parity import reference_scores
from ..errors import BadUpdate, GatedModel, PushError, PushRefused, database_errors
from ..models.weights import state_dict
from ..swap.coordinator import CONTROL_TIMEOUT_S, SwapReport
from ..weight_update.files import DeltaFile, FileUpdate, FullFile
from .publish import Publisher, swap_metrics

__all__ = ["PushError", "push"]  # the CLI catches trainer.errors.TrainerError


def _read(delta: Path | None, full_dir: Path | None) -> tuple[type[FileUpdate], dict]:
    if (delta is None) == (full_dir is None):
        raise PushError("give exactly one of --delta FILE or --full DIR")
    if delta is not None:
        files, kind = [delta], DeltaFile
    else:
        files, kind = sorted(full_dir.glob("*.safetensors")), FullFile
        if not files:
            raise BadUpdate(f"{full_dir} holds no .safetensors files")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            tensors.update(load_file(str(file)))
        except Exception as exc:  # missing, unreadable, not safetensors
            raise BadUpdate(f"cannot read {file}: {exc}") from exc
    return kind, tensors


def print_reports(reports: list[SwapReport], log: Callable[[str], None]) -> None:
    log(
        "\n| backend | outcome | shipped | paused (s) | out of routing (s) | parity diff | reason |"
    )
    log("|---|---|---|---|---|---|---|")
    for r in reports:
        diff = "" if r.parity_diff is None else f"{r.parity_diff:.2e}"
        log(
            f"| {r.backend_id} {r.url} | {r.outcome} | {r.kind or ''} | {r.paused_s:.3f} | "
            f"{r.out_of_routing_s:.3f} | {diff} | "
            + "; ".join(x for x in (r.reason, r.fallback) if x)
            + " |"
        )


def push(
    settings: Settings,
    database_url: str,
    model_name: str,
    *,
    delta: Path | None = None,
    full_dir: Path | None = None,
    timeout_s: float = CONTROL_TIMEOUT_S,
    log: Callable[[str], None] = lambda line: print(line, flush=True),
) -> list[SwapReport]:
    """Record the weights as the next version and swap every backend to it; the reports of a
    push that at least one backend took. Raises trainer.errors.TrainerError otherwise (one-line
    messages): BadUpdate, GatedModel, UnknownModel, DatabaseUnavailable, VersionConflict,
    PushRefused."""
    kind, tensors = _read(delta, full_dir)
    engine = make_sync_engine(database_url)
    try:
        with (
            database_errors(),
            Publisher(settings, engine, model_name, timeout_s=timeout_s, log=log) as publisher,
        ):
            if publisher.gated():
                raise GatedModel(model_name)
            if publisher.model.lora:  # its backends serve adapters on the base weights
                raise BadUpdate(
                    f"{model_name} is trained with LoRA adapters: its versions come from the "
                    "trainer; rlgw push installs deltas or full weights of other models only"
                )
            parent, reference = publisher.latest()
            log(f"[push] rebuilt the reference of {model_name} version {parent}")
            expected = {k: tuple(v.shape) for k, v in state_dict(reference).items()}
            problems = kind.problems(tensors, expected)
            if problems:
                raise BadUpdate("; ".join(problems[:5]))
            reference_old = reference_scores(reference)
            kind.apply_to(reference, tensors)
            published = publisher.record(parent, tensors, kind)
            log(
                f"[push] version {published.version} ({kind.kind}, "
                f"{published.update.nbytes:,} bytes) -> every backend of {model_name}"
            )
            reports = publisher.push(published, reference, reference_old=reference_old)
            publisher.note(published.version, swap_metrics(reports))
    finally:
        engine.dispose()
    print_reports(reports, log)
    if not any(r.outcome == "swapped" for r in reports):
        raise PushRefused(model_name, published.version, reports)
    return reports
