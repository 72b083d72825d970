"""Weights in Hugging Face naming: load a reference model, make and apply deltas, write files."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def load_reference_model(model_dir: str | Path) -> torch.nn.Module:
    """The checkpoint as a transformers model in fp32, for reference forward passes."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    return model.eval()


def state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Parameters by HF name, tied weights once (as the checkpoint stores them)."""
    seen: set[int] = set()
    out = {}
    for name, param in model.named_parameters():
        if id(param) in seen:
            continue
        seen.add(id(param))
        out[name] = param.detach()
    return out


def delta(
    new: dict[str, torch.Tensor],
    old: dict[str, torch.Tensor],
    dtype: torch.dtype = torch.float32,
) -> dict[str, torch.Tensor]:
    """theta_new - theta_old, computed in fp32 and stored in `dtype`, for every parameter whose
    stored difference is not all zero (an unchanged tensor is left out: it costs no bytes, and a
    backend leaves a parameter the delta does not name as it is)."""
    out = {}
    for name, value in new.items():
        diff = (value.float() - old[name].float()).to(dtype)
        if bool(diff.any()):
            out[name] = diff.contiguous()
    return out


@torch.no_grad()
def adopt_delta(
    model: torch.nn.Module, served: dict[str, torch.Tensor], update: dict[str, torch.Tensor]
) -> None:
    """Make `model` hold exactly what a backend serving `served` holds after `update`:
    served + update in fp32 (as the worker adds it, and as `apply_delta` rebuilds the version from
    its files), `served` where the update names nothing. A delta stored in bf16 is theta_new
    rounded; after this the reference, the version files and the backends agree bit for bit, and
    the rounding of this version is carried into the next delta, never lost."""
    params = dict(model.named_parameters())
    for name, value in served.items():
        target = params[name]
        if name in update:
            torch.add(value, update[name].to(value.dtype), out=target.data)
        else:
            target.data.copy_(value)


@torch.no_grad()
def apply_delta(model: torch.nn.Module, update: dict[str, torch.Tensor]) -> None:
    params = dict(model.named_parameters())
    for name, value in update.items():
        params[name].add_(value.to(params[name].dtype))


@torch.no_grad()
def load_full(model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    params = dict(model.named_parameters())
    for name, value in tensors.items():
        params[name].copy_(value)


def write_update(tensors: dict[str, torch.Tensor], path: str | Path) -> int:
    """Write tensors as safetensors; returns the file size in bytes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
    return path.stat().st_size


def read_update(path: str | Path) -> dict[str, torch.Tensor]:
    return load_file(str(path))
