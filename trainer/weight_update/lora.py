"""A version as a peft LoRA adapter folder, loaded into vLLM at run time under a versioned name.

The backend keeps the base weights (version 0) and serves version N as the adapter `model@vN`
(`rlgw.adapters.served_name`), so an update never touches the served weights. `stage` checks the
folder and loads it beside the served adapter (`POST /v1/load_lora_adapter`, which vLLM
validates and preloads): nobody calls the new name until the gateway routes to it, so the load
needs no pause, and a refusal (a rank above `--max-lora-rank`, a damaged file) leaves the backend
as it was. `apply`, inside the pause, has nothing left to do; `verify` probes the new name;
`commit` unloads the model's other adapters once the backend is back in routing at the new
version; `rollback` unloads the new one: the old one never left, so the rollback is exact. Every
adapter holds the whole update from the base, so it installs its version whatever the backend
served before (not relative). The server needs `--enable-lora`, `--max-lora-rank` at least the
adapter's rank and `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True` (`rlgw/backend_launcher.py`).

`load_lora_adapter` hands vLLM a path that the backend's own host must read. For a backend on
another host the publisher offers a stored version as `RemoteLora` instead (`remote.py`, with a
version-file server): only its stage differs, which has the backend's worker download both files
and verify them first, then loads the backend's own copy.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Self

import torch
from safetensors.torch import load_file

from rlgw.adapters import served_name
from trainer.backends.vllm_control import ControlError, VllmControl

from .base import Staged, WeightUpdate

# peft's names (rlgw_vllm/fetch.py, inside the worker, names a downloaded adapter's files the same)
CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"


class LoraAdapter(WeightUpdate):
    """The adapter folder of `model_name`'s `version` (peft `save_pretrained`)."""

    kind = "lora"
    relative = False

    def __init__(self, path: str | Path, model_name: str, version: int) -> None:
        self.path, self.model_name, self.version = str(path), model_name, version

    def __repr__(self) -> str:
        return f"LoraAdapter({self.path!r}, {self.model_name!r}, {self.version})"

    @classmethod
    def write(cls, model: torch.nn.Module, path: str | Path, model_name: str, version: int) -> Self:
        """Save the adapter of a peft model (the trainer's reference) as the version's folder."""
        model.save_pretrained(str(path), safe_serialization=True)
        sort_target_modules(Path(path) / CONFIG_FILE)
        return cls(path, model_name, version)

    @property
    def payload_file(self) -> Path:
        """The file the version's checksum is taken of."""
        return Path(self.path) / WEIGHTS_FILE

    @property
    def nbytes(self) -> int:
        return self.payload_file.stat().st_size + (Path(self.path) / CONFIG_FILE).stat().st_size

    @property
    def name(self) -> str:
        """The adapter's name inside vLLM."""
        return served_name(self.model_name, self.version, lora=True)

    def served_name(self, model_name: str, version: int | None) -> str:
        return served_name(model_name, version, lora=True)

    def problems(self) -> list[str]:
        """What makes the folder unusable (no config, no rank, unreadable or non-finite weights)."""
        try:
            config = json.loads((Path(self.path) / CONFIG_FILE).read_text())
        except (OSError, ValueError) as exc:
            return [f"no readable {CONFIG_FILE} in {self.path}: {exc}"]
        if not isinstance(config.get("r"), int) or config["r"] < 1:
            return [f"{CONFIG_FILE} has no rank r >= 1"]
        try:
            tensors = load_file(str(self.payload_file))
        except Exception as exc:  # safetensors raises its own error types for a damaged file
            return [f"unreadable {WEIGHTS_FILE}: {exc}"]
        bad = [name for name, value in tensors.items() if not bool(torch.isfinite(value).all())]
        return [f"{len(bad)} tensor(s) with NaN or inf, e.g. {bad[0]}"] if bad else []

    def load_onto(self, model: torch.nn.Module) -> torch.nn.Module:
        """The base `model` with this adapter on top, trainable: the version's reference."""
        from peft import PeftModel

        return PeftModel.from_pretrained(model, self.path, is_trainable=True).eval()

    # ------------------------------------------------------------------ the seam
    def stage(self, backend: VllmControl) -> Staged:
        problems = self.problems()
        if problems:
            raise ControlError(f"adapter {self.name} refused: {'; '.join(problems)}")
        loaded = backend.load_lora_adapter(self.name, self.path)  # served by nobody yet
        return Staged(self.nbytes, {"adapter": self.name, "path": self.path, "vllm": loaded})

    def apply(self, backend: VllmControl) -> Any:
        """Nothing: the staged adapter serves as soon as the gateway routes to its name."""
        return None

    def commit(self, backend: VllmControl) -> None:
        for other in loaded_adapters(backend, self.model_name):
            if other != self.name:
                backend.unload_lora_adapter(other)

    def rollback(self, backend: VllmControl) -> None:
        backend.unload_lora_adapter(self.name)


def sort_target_modules(config_file: Path) -> None:
    """Rewrite peft's `target_modules` in sorted order: peft lists a set in iteration order, so
    two saves of one adapter differed in bytes, and so in the checksum a version is sent with."""
    config = json.loads(config_file.read_text())
    if isinstance(config.get("target_modules"), list):
        config["target_modules"] = sorted(config["target_modules"])
        config_file.write_text(json.dumps(config, indent=2, sort_keys=True))


def loaded_adapters(backend: VllmControl, model_name: str) -> list[str]:
    """The adapters of `model_name` the backend has loaded (its /v1/models lists them)."""
    prefix = served_name(model_name, 1, lora=True).removesuffix("1")  # "model@v"
    return [
        name
        for name in backend.served_models()
        if name.startswith(prefix) and name[len(prefix) :].isdigit()
    ]
