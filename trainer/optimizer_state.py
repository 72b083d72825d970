"""The trainer's AdamW moments, kept across restarts: saved after each committed version, with
the state before it kept beside, so a candidate the gate rejects continues from its parent's."""

from __future__ import annotations

import os
from pathlib import Path

import torch


def state_path(home: Path, model: str) -> Path:
    """One file per model (the moments are as large as two copies of the weights)."""
    return home / "versions" / model / "optimizer.pt"


def previous_path(path: Path) -> Path:
    """The state saved before the latest one (that of the version the latest was built on)."""
    return path.with_name("optimizer.previous.pt")


def save_optimizer(optimizer: torch.optim.Optimizer, path: Path, version: int) -> None:
    """Write the optimizer state reached by committing `version`, atomically; the state it
    replaces is kept as `previous_path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    torch.save({"version": version, "state": optimizer.state_dict()}, partial)
    if path.exists():
        os.replace(path, previous_path(path))
    os.replace(partial, path)


def _load(path: Path) -> dict | str:
    """The saved state, or why it cannot be used."""
    if not path.exists():
        return "no saved optimizer state"
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
        return {"version": int(saved["version"]), "state": saved["state"]}
    except (OSError, RuntimeError, KeyError, TypeError, ValueError) as exc:
        return f"saved optimizer state unreadable ({exc})"


def restore_optimizer(optimizer: torch.optim.Optimizer, path: Path, version: int) -> str:
    """Load the saved state if it belongs to `version` (the weights being trained from), else the
    one kept before it if that does; else leave the optimizer fresh. Returns what happened, for
    the log."""
    latest = _load(path)
    for saved in (latest, _load(previous_path(path))):
        if isinstance(saved, dict) and saved["version"] == version:
            try:
                optimizer.load_state_dict(saved["state"])
            except (KeyError, TypeError, ValueError) as exc:
                return f"saved optimizer state unreadable ({exc}): AdamW moments start at zero"
            return f"optimizer state of version {version} restored"
    if isinstance(latest, str):
        return f"{latest}: AdamW moments start at zero"
    return (
        f"saved optimizer state is of version {latest['version']}, not {version} (a push or a "
        "rollback since, or a stop between a commit and its save): AdamW moments start at zero"
    )
