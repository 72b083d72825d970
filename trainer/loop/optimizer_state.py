"""The trainer's AdamW moments, kept across restarts: saved after each committed version, with
the state before it kept beside, so a candidate the gate rejects continues from its parent's.

Two layouts: torch's own (`optimizer.state_dict()`, moments keyed by parameter index) for one
process, and the whole state keyed by parameter name that FSDP2 gathers for several ranks. A file
records its layout; one written in the other layout is not loaded (the moments start at zero)."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import torch

INDEX, NAME = "index", "name"
FRESH = "AdamW moments start at zero"


def state_path(home: Path, model: str) -> Path:
    """One file per model (the moments are as large as two copies of the weights)."""
    return home / "versions" / model / "optimizer.pt"


def previous_path(path: Path) -> Path:
    """The state saved before the latest one (that of the version the latest was built on)."""
    return path.with_name("optimizer.previous.pt")


def save_state(state: dict, path: Path, version: int, *, keyed_by: str = INDEX) -> None:
    """Write the optimizer state reached by committing `version`, atomically; the state it
    replaces is kept as `previous_path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    torch.save({"version": version, "keyed_by": keyed_by, "state": state}, partial)
    if path.exists():
        os.replace(path, previous_path(path))
    os.replace(partial, path)


def _read(path: Path) -> dict | str:
    """The saved file, or why it cannot be used."""
    if not path.exists():
        return "no saved optimizer state"
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
        return {
            "version": int(saved["version"]),
            "keyed_by": saved.get("keyed_by", INDEX),
            "state": saved["state"],
        }
    except (OSError, RuntimeError, KeyError, TypeError, ValueError) as exc:
        return f"saved optimizer state unreadable ({exc})"


def load_state(path: Path, version: int, *, keyed_by: str = INDEX) -> tuple[dict | None, str]:
    """(the saved state, what happened) for `version`: the latest file, else the one kept before
    it, if it belongs to that version and has this layout; else (None, why not): the optimizer
    then starts fresh."""
    latest = _read(path)
    for saved in (latest, _read(previous_path(path))):
        if isinstance(saved, dict) and saved["version"] == version:
            if saved["keyed_by"] != keyed_by:
                return None, (
                    f"saved optimizer state is keyed by parameter {saved['keyed_by']}, this "
                    f"trainer's by {keyed_by} (another process count): {FRESH}"
                )
            return saved["state"], f"optimizer state of version {version} restored"
    if isinstance(latest, str):
        return None, f"{latest}: {FRESH}"
    return None, (
        f"saved optimizer state is of version {latest['version']}, not {version} (a push or a "
        f"rollback since, or a stop between a commit and its save): {FRESH}"
    )


def frozen_moments(optimizer: torch.optim.Optimizer) -> dict:
    """A copy of the optimizer's state_dict that its next step leaves as it is."""
    state = optimizer.state_dict()
    return {
        "state": {
            index: {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in entry.items()}
            for index, entry in state["state"].items()
        },
        "param_groups": copy.deepcopy(state["param_groups"]),
    }


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
