"""`rlgw push`: install a delta or full weights as a new policy version on every backend."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file
from sqlalchemy import select

from rlgw.backend_state import backends_of
from rlgw.db.engine import make_sync_engine, sync_session_factory
from rlgw.db.models import PolicyVersion, RegisteredModel
from rlgw.settings import Settings

from .parity import reference_scores
from .swap.coordinator import SwapCoordinator, SwapPlan, SwapReport
from .versions import file_sha256, materialize, version_file
from .vllm_worker import validate_update
from .weight_update.files import FullFile, stored_update
from .weights import apply_delta, load_full, state_dict, write_update


class PushError(RuntimeError):
    """The update cannot become a version (unknown model, malformed weights)."""


def _read_full_dir(full_dir: Path) -> dict[str, torch.Tensor]:
    files = sorted(full_dir.glob("*.safetensors"))
    if not files:
        raise PushError(f"{full_dir} holds no .safetensors files")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        tensors.update(load_file(str(file)))
    return tensors


def _print_reports(reports: list[SwapReport]) -> None:
    print("\n| backend | outcome | paused (s) | out of routing (s) | parity diff | reason |")
    print("|---|---|---|---|---|---|")
    for r in reports:
        diff = "" if r.parity_diff is None else f"{r.parity_diff:.2e}"
        print(
            f"| {r.backend_id} {r.url} | {r.outcome} | {r.paused_s:.3f} | "
            f"{r.out_of_routing_s:.3f} | {diff} | {r.reason or ''} |"
        )


def push(
    settings: Settings,
    database_url: str,
    model_name: str,
    *,
    delta: Path | None = None,
    full_dir: Path | None = None,
) -> list[SwapReport]:
    if (delta is None) == (full_dir is None):
        raise PushError("give exactly one of --delta FILE or --full DIR")
    engine = make_sync_engine(database_url)
    try:
        with sync_session_factory(engine)() as db:
            model = db.scalar(select(RegisteredModel).where(RegisteredModel.name == model_name))
            if model is None:
                raise PushError(f"no model named {model_name!r}")
            parent = model.current_version
            print(f"[push] rebuilding the reference of {model_name} version {parent}", flush=True)
            reference = materialize(db, model, parent)
            expected = {k: tuple(v.shape) for k, v in state_dict(reference).items()}
            kind = "delta" if delta is not None else "full"
            update = load_file(str(delta)) if delta is not None else _read_full_dir(full_dir)
            problems = validate_update(update, kind, expected)
            if problems:
                raise PushError("; ".join(problems[:5]))
            old_scores = reference_scores(reference)
            (apply_delta if kind == "delta" else load_full)(reference, update)
            new_version = parent + 1
            path = version_file(settings.home, model_name, new_version, kind)
            path.parent.mkdir(parents=True, exist_ok=True)
            if delta is not None:
                shutil.copyfile(delta, path)
            else:
                write_update(update, path)
            full_path = None
            behind = [b for b in db.scalars(backends_of(model.id)) if b.served_version != parent]
            if behind:  # they get the full weights (an anchor sync) instead of the delta
                full_path = version_file(settings.home, model_name, new_version, "anchor")
                write_update(state_dict(reference), full_path)
            db.add(
                PolicyVersion(
                    model_id=model.id,
                    version=new_version,
                    parent_version=parent,
                    kind=kind,
                    weights_path=str(path),
                    checksum=file_sha256(path),
                )
            )
            db.commit()
            plan = SwapPlan(
                model_name=model_name,
                model_id=model.id,
                parent_version=parent,
                new_version=new_version,
                update=stored_update(kind, path),
                reference_new=reference_scores(reference),
                reference_old=old_scores,
                fallback=FullFile(full_path) if full_path else None,
            )
        coordinator = SwapCoordinator(
            engine,
            drain_timeout_s=settings.drain_timeout_s,
            parity_tolerance=settings.parity_tolerance,
        )
        print(
            f"[push] version {new_version} ({kind}, {path.stat().st_size:,} bytes) -> "
            f"every backend of {model_name}",
            flush=True,
        )
        reports = coordinator.push(plan)
        if any(r.outcome == "swapped" for r in reports):
            with sync_session_factory(engine)() as db, db.begin():
                db.get(RegisteredModel, model.id).current_version = new_version
        _print_reports(reports)
        return reports
    finally:
        engine.dispose()
