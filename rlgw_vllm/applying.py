"""Applying a staged update inside the pause, and keeping (commit) or undoing (rollback) it."""

from __future__ import annotations

import time
from typing import Any

import torch

from .staging import Staging
from .timing import Phases
from .updates import Undo


class Applying(Staging):
    @torch.no_grad()
    def _rlgw_install_saved(self, names: list[str], saved: dict[str, torch.Tensor]) -> None:
        params = self._rlgw_params()
        for name in names:
            params[name].data.copy_(saved[name])
        self._rlgw_repack(self._rlgw_gemm_modules(set(names)))

    @torch.no_grad()
    def _rlgw_swap_in(self, data: dict[str, torch.Tensor], states: list, which: str) -> None:
        params = self._rlgw_params()
        for name, value in data.items():
            params[name].data = value
        self._rlgw_set_attrs(states, which)

    @torch.no_grad()
    def rlgw_apply(self) -> dict[str, Any]:
        """Apply the staged update; on any failure restore the previous weights exactly."""
        self._rlgw_wait_for_stage()
        prepared = self._rlgw_staged
        if prepared is None:
            return {"ok": False, "error": "nothing staged"}
        if prepared.generation != self._rlgw_generation:
            self._rlgw_discard_staged()
            return {"ok": False, "error": "the weights changed since staging: stage again"}
        t0 = time.perf_counter()
        phases = Phases()
        params = self._rlgw_params()
        if prepared.mode == "swap":
            undo = Undo(
                "swap",
                prepared.names,
                old_data={name: params[name].data for name in prepared.names},
                modules=prepared.modules,
            )
            repacked = len(prepared.modules)
            phases.start("swap")
            try:
                self._rlgw_swap_in(prepared.new_data, prepared.modules, "new")
            except Exception as exc:
                self._rlgw_swap_in(undo.old_data, undo.modules, "old")
                return {"ok": False, "error": f"apply failed and was undone: {exc}"}
        else:
            undo = Undo("inplace", prepared.names, saved=prepared.saved)
            repacked = 0
            try:
                phases.start("update")
                for name in prepared.names:
                    target = params[name].data
                    if prepared.kind == "delta":
                        target.add_(prepared.update[name])
                    else:
                        target.copy_(prepared.update[name])
                phases.start("repack")
                modules = self._rlgw_gemm_modules(set(prepared.names))
                self._rlgw_repack(modules)
                repacked = len(modules)
            except Exception as exc:
                phases.stop()
                self._rlgw_install_saved(undo.names, undo.saved)
                return {"ok": False, "error": f"apply failed and was undone: {exc}"}
            self._rlgw_recycle(prepared.update)
        phases.stop()
        self._rlgw_staged = None
        self._rlgw_undo = undo
        self._rlgw_generation += 1
        return {
            "ok": True,
            "mode": prepared.mode,
            "parameters": len(prepared.names),
            "repacked": repacked,
            "phases": phases.seconds,
            "seconds": time.perf_counter() - t0,
        }

    def rlgw_rollback(self) -> dict[str, Any]:
        """Restore the weights from before the last apply."""
        self._rlgw_wait_for_stage()
        undo = self._rlgw_undo
        if undo is None:
            return {"ok": False, "error": "no snapshot to roll back to"}
        t0 = time.perf_counter()
        if undo.mode == "swap":
            replaced = {name: self._rlgw_params()[name].data for name in undo.names}
            self._rlgw_swap_in(undo.old_data, undo.modules, "old")
            self._rlgw_recycle(replaced)
        else:
            self._rlgw_install_saved(undo.names, undo.saved)
            self._rlgw_recycle(undo.saved)
        self._rlgw_undo = None
        self._rlgw_discard_staged()  # it was prepared against the weights just replaced
        self._rlgw_generation += 1
        return {"ok": True, "seconds": time.perf_counter() - t0}

    def rlgw_commit(self) -> dict[str, Any]:
        """Keep the applied weights; keep the old ones' memory for the next stage (or free it)."""
        self._rlgw_wait_for_stage()
        undo, self._rlgw_undo = self._rlgw_undo, None
        if undo is not None:
            self._rlgw_recycle(undo.old_data)
            self._rlgw_recycle(undo.saved)
        self._rlgw_discard_staged()
        return {"ok": True}
