"""vLLM worker extension: stage, apply, roll back and checksum weights inside a running server.

Loaded with `--worker-extension-cls trainer.vllm_worker.WeightUpdateExtension`; its methods are
called over vLLM's `/collective_rpc` (string arguments only, JSON-able results). An update is done
in three calls so that only the middle one happens while the server is paused:

    rlgw_stage(path, kind)   read and validate the safetensors file (names, shapes, finiteness)
    rlgw_apply()             snapshot the served weights, apply, repack (CPU); restore on failure
    rlgw_commit() / rlgw_rollback()   drop the snapshot, or restore it exactly

`kind` is "full" (new weights) or "delta" (theta_new - theta_served), both in Hugging Face naming.
A delta goes through the model's own `load_weights`, which knows how q/k/v and gate/up are fused:
every parameter is zeroed, the delta is loaded into its slices, and the snapshot is added back.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any

import torch

KINDS = ("full", "delta")


def _checkpoint_shapes(model_dir: str) -> dict[str, tuple[int, ...]]:
    """Parameter names and shapes of the checkpoint the server was launched with (headers only)."""
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for file in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                shapes[name] = tuple(f.get_slice(name).get_shape())
    return shapes


def validate_update(
    tensors: dict[str, torch.Tensor], kind: str, expected: dict[str, tuple[int, ...]]
) -> list[str]:
    """Every problem that would make the update unsafe to apply; empty when it is sound."""
    if kind not in KINDS:
        return [f"kind must be one of {KINDS}, not {kind!r}"]
    problems = []
    for name, tensor in tensors.items():
        if name not in expected:
            problems.append(f"unknown parameter {name}")
        elif tuple(tensor.shape) != expected[name]:
            problems.append(f"{name}: shape {tuple(tensor.shape)}, expected {expected[name]}")
        elif not tensor.is_floating_point():
            problems.append(f"{name}: dtype {tensor.dtype} is not floating point")
        elif not bool(torch.isfinite(tensor).all()):
            problems.append(f"{name}: contains NaN or infinity")
    if kind == "full":
        missing = sorted(set(expected) - set(tensors))
        if missing:
            problems.append(f"full update misses {len(missing)} parameters, e.g. {missing[0]}")
    if not tensors:
        problems.append("the update holds no tensors")
    return problems


def _is_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


class WeightUpdateExtension:
    """Mixed into vLLM's worker class; `self.model_runner` is the worker's model runner."""

    _rlgw_staged: tuple[str, dict[str, torch.Tensor]] | None = None
    _rlgw_snapshot: dict[str, torch.Tensor] | None = None
    _rlgw_expected: dict[str, tuple[int, ...]] | None = None

    # ------------------------------------------------------------------ helpers
    def _rlgw_model(self) -> torch.nn.Module:
        return self.model_runner.get_model()  # type: ignore[attr-defined]

    def _rlgw_params(self) -> dict[str, torch.nn.Parameter]:
        return dict(self._rlgw_model().named_parameters())

    def _rlgw_check_weights_kept(self) -> str | None:
        for name, param in self._rlgw_params().items():
            if param.numel() == 0:
                return (
                    f"parameter {name} is empty: the rlgw vLLM plugin is not active "
                    "(start the server with `rlgw backend`, or set RLGW_VLLM_KEEP_WEIGHTS=1)"
                )
        return None

    def _rlgw_repack(self) -> int:
        """Rebuild the CPU build's packed copies of linear weights (no-op on GPU builds)."""
        if not _is_cpu():
            return 0
        from vllm.model_executor.layers import utils

        count = 0
        for module in self._rlgw_model().modules():
            if hasattr(module, "cpu_linear") and getattr(module, "weight", None) is not None:
                utils.dispatch_cpu_unquantized_gemm(module, remove_weight=False)
                count += 1
        return count

    @torch.no_grad()
    def _rlgw_restore(self, snapshot: dict[str, torch.Tensor]) -> None:
        params = self._rlgw_params()
        for name, saved in snapshot.items():
            params[name].data.copy_(saved)
        self._rlgw_repack()

    # ------------------------------------------------------------------ rpc methods
    def rlgw_stage(self, path: str, kind: str) -> dict[str, Any]:
        """Read and validate an update without touching the served weights."""
        from safetensors.torch import load_file

        t0 = time.perf_counter()
        self._rlgw_staged = None
        problem = self._rlgw_check_weights_kept()
        if problem:
            return {"ok": False, "error": problem}
        if self._rlgw_expected is None:
            self._rlgw_expected = _checkpoint_shapes(
                self.model_runner.model_config.model  # type: ignore[attr-defined]
            )
        try:
            tensors = load_file(path)
        except Exception as exc:  # a missing or malformed file is a refused update, not a crash
            return {"ok": False, "error": f"cannot read {path}: {exc}"}
        problems = validate_update(tensors, kind, self._rlgw_expected)
        if problems:
            return {"ok": False, "error": "; ".join(problems[:5])}
        self._rlgw_staged = (kind, tensors)
        nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
        return {
            "ok": True,
            "tensors": len(tensors),
            "bytes": nbytes,
            "seconds": time.perf_counter() - t0,
        }

    @torch.no_grad()
    def rlgw_apply(self) -> dict[str, Any]:
        """Apply the staged update; on any failure restore the previous weights exactly."""
        if self._rlgw_staged is None:
            return {"ok": False, "error": "nothing staged"}
        kind, tensors = self._rlgw_staged
        t0 = time.perf_counter()
        phases: dict[str, float] = {}
        tp = time.perf_counter()
        params = self._rlgw_params()
        snapshot = {name: p.detach().clone() for name, p in params.items()}
        phases["snapshot"] = time.perf_counter() - tp
        try:
            model = self._rlgw_model()
            tp = time.perf_counter()
            if kind == "delta":
                for p in params.values():
                    p.data.zero_()
            phases["zero"] = time.perf_counter() - tp
            tp = time.perf_counter()
            model.load_weights(iter(tensors.items()))
            phases["load"] = time.perf_counter() - tp
            tp = time.perf_counter()
            if kind == "delta":
                for name, p in params.items():
                    p.data.add_(snapshot[name])
            phases["add"] = time.perf_counter() - tp
            tp = time.perf_counter()
            repacked = self._rlgw_repack()
            phases["repack"] = time.perf_counter() - tp
        except Exception as exc:
            self._rlgw_restore(snapshot)
            return {"ok": False, "error": f"apply failed and was undone: {exc}"}
        self._rlgw_staged = None
        self._rlgw_snapshot = snapshot
        return {
            "ok": True,
            "repacked": repacked,
            "phases": phases,
            "seconds": time.perf_counter() - t0,
        }

    def rlgw_rollback(self) -> dict[str, Any]:
        """Restore the weights from before the last apply."""
        if self._rlgw_snapshot is None:
            return {"ok": False, "error": "no snapshot to roll back to"}
        t0 = time.perf_counter()
        self._rlgw_restore(self._rlgw_snapshot)
        self._rlgw_snapshot = None
        return {"ok": True, "seconds": time.perf_counter() - t0}

    def rlgw_commit(self) -> dict[str, Any]:
        """Keep the applied weights; free the snapshot."""
        self._rlgw_snapshot = None
        self._rlgw_staged = None
        return {"ok": True}

    @torch.no_grad()
    def rlgw_checksum(self) -> str:
        """sha256 over the served parameters (vLLM naming, name order, raw bytes)."""
        digest = hashlib.sha256()
        for name, param in sorted(self._rlgw_params().items()):
            digest.update(name.encode())
            digest.update(param.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes())
        return digest.hexdigest()
