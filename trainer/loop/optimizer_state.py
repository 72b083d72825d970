"""The trainer's AdamW moments, kept across restarts: saved after each committed version, with
the state before it kept beside, so a candidate the gate rejects continues from its parent's.

On disk, per model: two slot files of raw tensor bytes (`optimizer.0.bin`, `optimizer.1.bin`),
overwritten in place in turn, and a small index (`optimizer.pt`, replaced atomically) that names
the version, layout and tensors each slot holds. A save first takes its slot out of the index,
then writes the bytes, then names the slot in the index: a stop at any point leaves the other
slot and the index true. Writing in place allocates no new page-cache pages and frees none, and
the bytes leave through plain writes (the interpreter's lock released): 0.24-0.55 s for the 1 GB
of a 135M model, against 0.9-3.3 s for `torch.save` to a new file and unlinking the old one under
generation's load (docs/benchmarks.md, "The prefix cache and the moments writer").

Two layouts: torch's own (`optimizer.state_dict()`, moments keyed by parameter index) for one
process, and the whole state keyed by parameter name that FSDP2 gathers for several ranks. A slot
records its layout; one written in the other layout is not loaded (the moments start at zero).
The single-file format of earlier releases (`optimizer.pt` holding the state itself, with
`optimizer.previous.pt`) is still read."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import torch

INDEX, NAME = "index", "name"
FRESH = "AdamW moments start at zero"
SLOTS = (0, 1)
_TENSOR = "__tensor__"  # a tensor's place in the index's skeleton: {_TENSOR: its number}


def state_path(home: Path, model: str) -> Path:
    """The model's index file (the moments are as large as two copies of the weights)."""
    return home / "versions" / model / "optimizer.pt"


def previous_path(path: Path) -> Path:
    """Earlier releases' file of the state before the latest one (read, never written)."""
    return path.with_name("optimizer.previous.pt")


def slot_path(path: Path, slot: int) -> Path:
    return path.with_name(f"optimizer.{slot}.bin")


def _flatten(value: Any, tensors: list[torch.Tensor]) -> Any:
    """`value` with every tensor replaced by its number in `tensors` (appended there)."""
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        return {_TENSOR: len(tensors) - 1}
    if isinstance(value, dict):
        return {k: _flatten(v, tensors) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_flatten(v, tensors) for v in value)
    return value


def _unflatten(value: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(value, dict):
        if set(value) == {_TENSOR}:
            return tensors[value[_TENSOR]]
        return {k: _unflatten(v, tensors) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_unflatten(v, tensors) for v in value)
    return value


def _write_all(file, data: memoryview) -> None:
    while data:
        data = data[file.write(data) :]


def _write_slot(slot: Path, tensors: list[torch.Tensor]) -> list[tuple[int, str, list[int]]]:
    """The tensors' bytes, one after the other, over what the slot held; their (offset, dtype,
    shape)."""
    placed, offset = [], 0
    with open(slot, "r+b" if slot.exists() else "wb", buffering=0) as file:
        for tensor in tensors:
            flat = tensor.detach().to("cpu").contiguous().reshape(-1)
            data = memoryview(flat.view(torch.uint8).numpy()).cast("B")
            _write_all(file, data)
            placed.append((offset, str(tensor.dtype).removeprefix("torch."), list(tensor.shape)))
            offset += len(data)
        file.truncate(offset)
    return placed


def _read_slot(slot: Path, placed: list) -> list[torch.Tensor]:
    size = slot.stat().st_size
    data = torch.from_file(str(slot), shared=False, size=size, dtype=torch.uint8)
    tensors = []
    for offset, dtype, shape in placed:
        kind = getattr(torch, dtype)
        count = torch.Size(shape).numel() * torch.empty((), dtype=kind).element_size()
        if offset + count > size:
            raise ValueError(f"{slot.name} is shorter than its index says")
        tensors.append(data[offset : offset + count].view(kind).reshape(shape).clone())
    return tensors


def _load(path: Path) -> Any:
    """The index file as torch wrote it; None when absent; the reason when unreadable."""
    if not path.exists():
        return None
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError, ValueError) as exc:
        return f"saved optimizer state unreadable ({exc})"


def _index_of(raw: Any) -> dict:
    """The index: {"slots": {slot: entry or None}, "latest": slot or None}; empty for anything
    else (none yet, unreadable, or an earlier release's single file)."""
    if isinstance(raw, dict) and "slots" in raw:
        return raw
    return {"slots": dict.fromkeys(SLOTS), "latest": None}


def _write_index(path: Path, index: dict) -> None:
    partial = path.with_suffix(".partial")
    torch.save(index, partial)
    os.replace(partial, path)


def save_state(state: dict, path: Path, version: int, *, keyed_by: str = INDEX) -> None:
    """Write the optimizer state reached by committing `version` into the slot that does not
    hold the latest state; the latest becomes the one kept before it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    index = _index_of(_load(path))
    latest = index["latest"]
    slot = SLOTS[1] if latest == SLOTS[0] else SLOTS[0]
    kept = {latest: index["slots"][latest]} if latest is not None else {}
    _write_index(path, {"slots": {**dict.fromkeys(SLOTS), **kept}, "latest": latest})
    previous_path(path).unlink(missing_ok=True)  # an earlier release's, replaced by the slots
    tensors: list[torch.Tensor] = []
    skeleton = _flatten(state, tensors)
    placed = _write_slot(slot_path(path, slot), tensors)
    entry = {"version": version, "keyed_by": keyed_by, "skeleton": skeleton, "tensors": placed}
    _write_index(path, {"slots": {**dict.fromkeys(SLOTS), **kept, slot: entry}, "latest": slot})


def _legacy(saved: Any) -> dict | str:
    """An earlier release's whole state, as `torch.save` wrote it, or why it cannot be used."""
    try:
        return {
            "version": int(saved["version"]),
            "keyed_by": saved.get("keyed_by", INDEX),
            "state": saved["state"],
        }
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        return f"saved optimizer state unreadable ({exc})"


def _slot_state(path: Path, slot: int, entry: dict) -> dict | str:
    try:
        tensors = _read_slot(slot_path(path, slot), entry["tensors"])
        state = _unflatten(entry["skeleton"], tensors)
        return {"version": int(entry["version"]), "keyed_by": entry["keyed_by"], "state": state}
    except (OSError, RuntimeError, KeyError, TypeError, ValueError, AttributeError) as exc:
        return f"saved optimizer state unreadable ({exc})"


def saved_states(path: Path) -> list[dict | str]:
    """What is saved, the latest first: each {"version", "keyed_by", "state"}, or why it
    cannot be used."""
    raw = _load(path)
    if raw is None or isinstance(raw, str):
        return [raw or "no saved optimizer state"]
    if "slots" not in raw:  # an earlier release's single file, and the one kept before it
        previous = _load(previous_path(path))
        return [_legacy(raw), *([_legacy(previous)] if previous is not None else [])]
    latest = raw["latest"]
    if latest is None:
        return ["no saved optimizer state"]
    order = (latest, *(s for s in SLOTS if s != latest))
    return [_slot_state(path, s, raw["slots"][s]) for s in order if raw["slots"].get(s)]


def load_state(path: Path, version: int, *, keyed_by: str = INDEX) -> tuple[dict | None, str]:
    """(the saved state, what happened) for `version`: the latest state, else the one kept
    before it, if it belongs to that version and has this layout; else (None, why not): the
    optimizer then starts fresh."""
    saved = saved_states(path)
    for entry in saved:
        if isinstance(entry, dict) and entry["version"] == version:
            if entry["keyed_by"] != keyed_by:
                return None, (
                    f"saved optimizer state is keyed by parameter {entry['keyed_by']}, this "
                    f"trainer's by {keyed_by} (another process count): {FRESH}"
                )
            return entry["state"], f"optimizer state of version {version} restored"
    latest = saved[0]
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
