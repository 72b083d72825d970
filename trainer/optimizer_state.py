"""The trainer's AdamW moments, kept across restarts: saved after each committed version."""

from __future__ import annotations

import os
from pathlib import Path

import torch


def state_path(home: Path, model: str) -> Path:
    """One file per model (the moments are as large as two copies of the weights)."""
    return home / "versions" / model / "optimizer.pt"


def save_optimizer(optimizer: torch.optim.Optimizer, path: Path, version: int) -> None:
    """Write the optimizer state reached by committing `version`, atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    torch.save({"version": version, "state": optimizer.state_dict()}, partial)
    os.replace(partial, path)


def restore_optimizer(optimizer: torch.optim.Optimizer, path: Path, version: int) -> str:
    """Load the saved state if it belongs to `version` (the weights being trained from); else
    leave the optimizer fresh. Returns what happened, for the log."""
    if not path.exists():
        return "no saved optimizer state: AdamW moments start at zero"
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
        saved_version = int(saved["version"])
        if saved_version != version:
            return (
                f"saved optimizer state is of version {saved_version}, not {version} (a push "
                "since, or a stop between a commit and its save): AdamW moments start at zero"
            )
        optimizer.load_state_dict(saved["state"])
    except (OSError, RuntimeError, KeyError, TypeError, ValueError) as exc:
        return f"saved optimizer state unreadable ({exc}): AdamW moments start at zero"
    return f"optimizer state of version {version} restored"
