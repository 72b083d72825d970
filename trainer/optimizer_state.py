"""The trainer's AdamW moments, kept across restarts: saved after each committed version.

Two layouts: torch's own (`optimizer.state_dict()`, moments keyed by parameter index) for one
process, and the whole state keyed by parameter name that FSDP2 gathers for several ranks. A file
records its layout; one written in the other layout is not loaded (the moments start at zero)."""

from __future__ import annotations

import os
from pathlib import Path

import torch

INDEX, NAME = "index", "name"
FRESH = "AdamW moments start at zero"


def state_path(home: Path, model: str) -> Path:
    """One file per model (the moments are as large as two copies of the weights)."""
    return home / "versions" / model / "optimizer.pt"


def save_state(state: dict, path: Path, version: int, *, keyed_by: str = INDEX) -> None:
    """Write the optimizer state reached by committing `version`, atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    torch.save({"version": version, "keyed_by": keyed_by, "state": state}, partial)
    os.replace(partial, path)


def load_state(path: Path, version: int, *, keyed_by: str = INDEX) -> tuple[dict | None, str]:
    """(the saved state, what happened) if it belongs to `version` and has this layout; else
    (None, why not): the optimizer then starts fresh."""
    if not path.exists():
        return None, f"no saved optimizer state: {FRESH}"
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
        saved_version = int(saved["version"])
        layout = saved.get("keyed_by", INDEX)
    except (OSError, RuntimeError, KeyError, TypeError, ValueError) as exc:
        return None, f"saved optimizer state unreadable ({exc}): {FRESH}"
    if saved_version != version:
        return None, (
            f"saved optimizer state is of version {saved_version}, not {version} (a push "
            f"since, or a stop between a commit and its save): {FRESH}"
        )
    if layout != keyed_by:
        return None, (
            f"saved optimizer state is keyed by parameter {layout}, this trainer's by {keyed_by} "
            f"(another process count): {FRESH}"
        )
    return saved["state"], f"optimizer state of version {version} restored"


def save_optimizer(optimizer: torch.optim.Optimizer, path: Path, version: int) -> None:
    save_state(optimizer.state_dict(), path, version, keyed_by=INDEX)


def restore_optimizer(optimizer: torch.optim.Optimizer, path: Path, version: int) -> str:
    """Load the saved state if it belongs to `version` (the weights being trained from); else
    leave the optimizer fresh. Returns what happened, for the log."""
    state, message = load_state(path, version, keyed_by=INDEX)
    if state is None:
        return message
    try:
        optimizer.load_state_dict(state)
    except (RuntimeError, KeyError, TypeError, ValueError) as exc:
        return f"saved optimizer state unreadable ({exc}): {FRESH}"
    return message
