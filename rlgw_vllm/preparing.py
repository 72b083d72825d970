"""Preparing a staged update: the model's own `load_weights` run with every parameter pointed at
scratch (so the served weights are never written), then, for a swap, the new tensors and their
packed copies built aside; for an in-place apply, the affected parameters copied aside."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from .buffers import BufferPool
from .packing import Packing
from .serving_lock import ServingLock
from .timing import Phases
from .updates import Prepared

LOAD_CHUNK_BYTES = 16 * 2**20  # tensors loaded per hold of the serving lock


def _trap(param: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A stand-in with the parameter's shape and dtype whose every element is one zero scalar: a
    write into it raises (or lands in that scalar), and never touches the served tensor.
    Returns (stand-in, scalar)."""
    scalar = torch.zeros((), dtype=param.dtype, device=param.device)
    return scalar.expand(param.shape), scalar


def _chunks(tensors: dict[str, torch.Tensor], limit: int) -> Iterator[list[tuple[str, Any]]]:
    """The tensors in groups of at most `limit` bytes (a larger tensor goes alone)."""
    group: list[tuple[str, torch.Tensor]] = []
    size = 0
    for item in tensors.items():
        nbytes = item[1].numel() * item[1].element_size()
        if group and size + nbytes > limit:
            yield group
            group, size = [], 0
        group.append(item)
        size += nbytes
    if group:
        yield group


class Preparing(ServingLock, BufferPool, Packing):
    @torch.no_grad()
    def _rlgw_load_into_scratch(
        self,
        kind: str,
        tensors: dict[str, torch.Tensor],
        targets: frozenset[str] | None,
        phases: Phases,
    ) -> tuple[dict[str, torch.Tensor], set[str]]:
        """Run load_weights with every parameter pointed at scratch (targets, or all when None)
        or at a trap. Returns the scratch tensors and the vLLM names load_weights reported."""
        params = self._rlgw_params()
        names = set(params) if targets is None else set(targets)
        phases.start("alloc")
        scratch = {}
        for name in names:
            current = params[name].data
            buffer = self._rlgw_buffer(name, current)
            # delta: zero where nothing is loaded; full: keep the current value there
            scratch[name] = buffer.copy_(current) if kind == "full" else buffer.zero_()
        traps = {n: _trap(p.data) for n, p in params.items() if n not in names}
        phases.start("load")
        originals = {name: p.data for name, p in params.items()}
        reported: set[str] = set()
        try:
            for chunk in _chunks(tensors, LOAD_CHUNK_BYTES):
                with self._rlgw_serving_paused():  # parameters point at scratch in here
                    try:
                        for name, p in params.items():
                            p.data = scratch[name] if name in scratch else traps[name][0]
                        reported |= set(self._rlgw_model().load_weights(iter(chunk)) or ())
                    finally:
                        for name, p in params.items():
                            p.data = originals[name]
                if any(bool(scalar.ne(0)) for _, scalar in traps.values()):
                    raise RuntimeError(
                        "load_weights wrote into a parameter outside the expected set"
                    )
        except Exception:
            self._rlgw_recycle(scratch)
            raise
        phases.stop()
        return scratch, reported

    @torch.no_grad()
    def _rlgw_prepare(self, kind: str, tensors: dict[str, torch.Tensor]) -> Prepared:
        params = self._rlgw_params()
        mode = self._rlgw_mode()
        phases = Phases()
        self._rlgw_reused = 0
        if self._rlgw_targets is None:
            self._rlgw_targets = {}
        key = (kind, frozenset(tensors))
        targets = self._rlgw_targets.get(key)
        scratch: dict[str, torch.Tensor] | None = None
        if targets is not None:
            try:
                scratch, loaded = self._rlgw_load_into_scratch(kind, tensors, targets, phases)
                if not loaded <= targets:
                    self._rlgw_recycle(scratch)
                    scratch = None
            except Exception:  # e.g. a write into a trap: learn the targets again
                scratch = None
        if scratch is None:  # every parameter gets scratch; learn which ones the update touches
            scratch, loaded = self._rlgw_load_into_scratch(kind, tensors, None, phases)
            unknown = sorted(loaded - set(params))
            if unknown:
                self._rlgw_recycle(scratch)
                raise RuntimeError(f"the update loads non-parameter tensors, e.g. {unknown[0]}")
            phases.start("find_changed")
            changed = {
                name
                for name, value in scratch.items()
                if name not in loaded
                and (
                    bool(value.any())
                    if kind == "delta"
                    else not torch.equal(value, params[name].data)
                )
            }
            targets = frozenset(loaded | changed)
            self._rlgw_targets[key] = targets
            self._rlgw_recycle({n: t for n, t in scratch.items() if n not in targets})
            scratch = {name: scratch[name] for name in targets}
            phases.stop()
        names = sorted(targets)
        prepared = Prepared(kind, mode, self._rlgw_generation, names, {})
        if mode == "swap":
            phases.start("add")
            if kind == "delta":
                for name in names:  # scratch + served == served + delta, bitwise
                    scratch[name].add_(params[name].data)
            prepared.new_data = scratch
            phases.start("pack")
            modules = self._rlgw_gemm_modules(set(names))
            prepared.modules = self._rlgw_pack_aside(modules, prepared.new_data)
        else:
            prepared.update = scratch
            phases.start("snapshot")
            # Kept in host memory on an accelerator: only a failure or a rollback reads it.
            prepared.saved = {
                name: self._rlgw_buffer(name, params[name].data, "cpu").copy_(params[name].data)
                for name in names
            }
        phases.start("free_pool")
        self._rlgw_pool = None  # what this update did not need: free it
        phases.stop()
        prepared.info = {
            "mode": mode,
            "parameters": len(names),
            "modules_repacked": len(prepared.modules),
            "buffers_reused": self._rlgw_reused,
            "phases": phases.seconds,
            "timeline": phases.timeline,
        }
        return prepared
