"""vLLM worker extension: stage, apply, roll back and checksum weights inside a running server.

Loaded with `--worker-extension-cls trainer.vllm_worker.WeightUpdateExtension`; its methods are
called over vLLM's `/collective_rpc` (string arguments only, JSON-able results). An update is done
in three calls so that only the middle one happens while the server is paused:

    rlgw_stage(path, kind)   start reading, validating and preparing the new weights in a
                             background thread; rlgw_stage_status() says when it is done
                             (rlgw_stage_url: the same file fetched over HTTP, verified first)
    rlgw_apply()             put the prepared weights in place; restore the old ones on failure
    rlgw_commit() / rlgw_rollback()   drop the old weights, or put them back exactly
    rlgw_info()              the serving dtype (the trainer's verification band depends on it)
    rlgw_fetch_adapter(...)  a LoRA version's adapter folder on this host (read from the
                             trainer's path, or downloaded and verified) for /v1/load_lora_adapter

`kind` is "full" (new weights) or "delta" (theta_new - theta_served), both in Hugging Face naming.

Preparing uses the model's own `load_weights`, which knows how q/k/v and gate/up are fused, but
points every parameter at a scratch tensor while it runs, so the served weights are never written
during staging: a delta is loaded into zeroed scratch tensors (the update laid out like the vLLM
parameters), a full update into copies of the current parameters. Only the parameters that
`load_weights` reports (learnt once per set of names; later stages give the others a stand-in
that refuses writes, and learn again if one is written) and the modules that own them get any
further work.

The stage runs in a background thread of the worker, so the engine loop keeps serving requests
while it reads, validates, adds and packs (requests to a lone backend no longer wait for a whole
stage). A forward pass must never see a parameter pointed at scratch, so every forward step
(`execute_model`, `sample_tokens`) holds a lock, and the stage holds it only while parameters are
redirected: one chunk of `load_weights` (LOAD_CHUNK_BYTES) at a time (a layer's new packed copy
is built on a stand-in, `_PackingShadow`, and needs no lock).
Everything else the stage does touches private tensors or only reads served ones. The stage
thread shares the GIL with the engine loop: it reads the file with plain reads (which release
the GIL) and takes its tensors as views of a map of it (trainer/safetensors_read.py), since
safetensors' load_file keeps the GIL while it copies each tensor out into fresh memory. And it
runs at a low CPU priority (trainer/cpu_priority.py, nice 19 by default): where the backend has
no spare core, the stage takes what the forward passes leave rather than slowing them.
RLGW_STAGE_BACKGROUND=0 stages inside the call instead (the engine loop waits, as before).

Two ways to apply:

- "swap" (CPU build with eager execution, the default there): staging also computes
  new = served + delta into new tensors and builds the new packed (oneDNN / SGL) copies of the
  affected linear layers aside (a tied lm_head shares the embedding's tensor but has its own packed
  copy: it is repacked whenever the embedding changes). The apply, inside the pause, only rebinds
  each affected parameter's data and each affected layer's packed GEMM: no arithmetic, no
  repacking. The old tensors and packed copies are kept until commit; a failed apply or a rollback
  rebinds them (exact by construction).
- "inplace" (GPU builds, where CUDA graphs hold the parameters' addresses; or forced with
  RLGW_WEIGHT_APPLY=inplace): staging also copies the affected parameters aside (to host memory on
  an accelerator); the apply adds the prepared update (or copies the full values) in place, then
  repacks the affected layers on a CPU build. A failure or a rollback copies the saved values back
  and repacks.

In both, the new weights are bitwise those of zero / load_weights(delta) / add back (a float
addition is commutative), i.e. exactly what the trainer computes as theta + delta.

Memory: a swap holds the old and the new weights (and, on a CPU, both packed copies) from stage to
commit. Tensors that stop being served are kept for the next stage (a fresh allocation costs page
faults: 0.7 s for 1.4 GB on the project's machine; zeroing a used buffer 0.07 s), so between swaps
the worker holds one spare copy of the affected weights; RLGW_WEIGHT_POOL=0 frees it instead.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from trainer.cpu_priority import quick_gil_handoff, yield_cpu_to_serving
from trainer.safetensors_read import MappedTensors, read_tensors

KINDS = ("full", "delta")
APPLY_MODES = ("swap", "inplace")
APPLY_MODE_ENV = "RLGW_WEIGHT_APPLY"
POOL_ENV = "RLGW_WEIGHT_POOL"
STAGE_BACKGROUND_ENV = "RLGW_STAGE_BACKGROUND"
FORWARD_METHODS = ("execute_model", "sample_tokens")  # the worker calls that read the weights
LOAD_CHUNK_BYTES = 16 * 2**20  # tensors loaded per hold of the serving lock
# Tests only: a background stage, once prepared, waits while this file is absent, so that a test
# can send requests while a stage is certainly in progress (a real stage of the tiny model ends
# in milliseconds: no other way to hold one open on demand).
STAGE_GATE_ENV = "RLGW_TEST_STAGE_GATE"
_MISSING = object()


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
        elif not _all_finite(tensor):
            problems.append(f"{name}: contains NaN or infinity")
    if kind == "full":
        missing = sorted(set(expected) - set(tensors))
        if missing:
            problems.append(f"full update misses {len(missing)} parameters, e.g. {missing[0]}")
    if not tensors:
        problems.append("the update holds no tensors")
    return problems


def _all_finite(tensor: torch.Tensor) -> bool:
    """No NaN or infinity. min and max propagate NaN, so one reduction pass decides it (about
    40x faster than isfinite(t).all() on a 1.4 GB update, and no temporary tensor)."""
    if tensor.numel() == 0:
        return True
    low, high = torch.aminmax(tensor)
    return bool(torch.isfinite(low)) and bool(torch.isfinite(high))


def _is_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def _trap(param: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A stand-in with the parameter's shape and dtype whose every element is one zero scalar: a
    write into it raises (or lands in that scalar), and never touches the served tensor.
    Returns (stand-in, scalar)."""
    scalar = torch.zeros((), dtype=param.dtype, device=param.device)
    return scalar.expand(param.shape), scalar


def _holding(lock: threading.RLock, method: Callable) -> Callable:
    """`method`, called with `lock` held."""

    def guarded(*args: Any, **kwargs: Any) -> Any:
        with lock:
            return method(*args, **kwargs)

    return guarded


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


class _Phases:
    """Seconds per named phase, accumulated."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.timeline: list[tuple[str, float, float]] = []  # (name, wall start, wall end)
        self._name: str | None = None
        self._t0 = self._wall0 = 0.0

    def start(self, name: str) -> None:
        self.stop()
        self._name, self._t0, self._wall0 = name, time.perf_counter(), time.time()

    def stop(self) -> None:
        if self._name is not None:
            elapsed = time.perf_counter() - self._t0
            self.seconds[self._name] = self.seconds.get(self._name, 0.0) + elapsed
            self.timeline.append((self._name, self._wall0, self._wall0 + elapsed))
            self._name = None


@dataclass
class _ModuleState:
    """What a CPU GEMM dispatch changed on one module: attribute values before and after."""

    module: torch.nn.Module
    old: dict[str, Any]
    new: dict[str, Any]


class _PackingShadow:
    """Stands in for a linear layer while vLLM's CPU GEMM dispatch packs its new weights: the
    dispatch reads `weight` and `bias` and sets `cpu_linear` (and may convert the bias, or keep
    an unpacked copy) on this object, never on the layer that serves."""

    def __init__(
        self, module: torch.nn.Module, by_id: dict[int, str], new_data: dict[str, torch.Tensor]
    ) -> None:
        for attr in ("weight", "bias"):
            param = getattr(module, attr, None)
            if param is not None:
                data = new_data.get(by_id.get(id(param), ""), param.data)
                param = torch.nn.Parameter(data, requires_grad=False)
            setattr(self, attr, param)

    def state(
        self, module: torch.nn.Module, by_id: dict[int, str], new_data: dict[str, torch.Tensor]
    ) -> _ModuleState:
        """What the dispatch set, as a change of `module`; the new tensors it converted (a bias to
        fp32, say) replace theirs in `new_data`."""
        for attr in ("weight", "bias"):
            name = by_id.get(id(getattr(module, attr, None)), "")
            if name in new_data:
                new_data[name] = getattr(self, attr).data
        new = {k: v for k, v in vars(self).items() if k not in ("weight", "bias")}
        old = {k: module.__dict__.get(k, _MISSING) for k in new}
        return _ModuleState(module, old, new)


@dataclass
class _Prepared:
    """A staged update, ready to apply."""

    kind: str
    mode: str
    generation: int  # the served weights it was prepared against
    names: list[str]  # affected vLLM parameters
    update: dict[str, torch.Tensor]  # inplace: values to add (delta) or copy (full)
    new_data: dict[str, torch.Tensor] = field(default_factory=dict)  # swap: new tensors
    modules: list[_ModuleState] = field(default_factory=list)  # swap: new packed GEMMs
    saved: dict[str, torch.Tensor] = field(default_factory=dict)  # inplace: old values
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Undo:
    """How to put back the weights from before the last apply."""

    mode: str
    names: list[str]
    old_data: dict[str, torch.Tensor] = field(default_factory=dict)  # swap
    modules: list[_ModuleState] = field(default_factory=list)  # swap
    saved: dict[str, torch.Tensor] = field(default_factory=dict)  # inplace


class WeightUpdateExtension:
    """Mixed into vLLM's worker class; `self.model_runner` is the worker's model runner."""

    _rlgw_staged: _Prepared | None = None
    _rlgw_undo: _Undo | None = None
    _rlgw_expected: dict[str, tuple[int, ...]] | None = None
    _rlgw_generation: int = 0  # bumped whenever the served weights change
    _rlgw_targets: dict[tuple[str, frozenset[str]], frozenset[str]] | None = None
    # Tensors no longer served (replaced weights, used scratch), reused by the next stage: a fresh
    # allocation costs page faults (0.7 s for 1.4 GB here), zeroing a used buffer 0.07 s.
    _rlgw_pool: dict[str, list[torch.Tensor]] | None = None
    _rlgw_reused = 0  # buffers taken from the pool by the current stage
    _rlgw_fetch: Any = None  # trainer.fetch.BackgroundFetch: a version file on its way (HTTP)
    _rlgw_fetched: tuple[str, dict[str, Any]] | None = None  # (sha256, report) of the last one
    _rlgw_adapter_fetch: Any = None  # trainer.fetch.BackgroundAdapterFetch: an adapter (HTTP)
    _rlgw_serving_lock: threading.RLock | None = None  # held by forward steps (see the docstring)
    _rlgw_stage_thread: threading.Thread | None = None
    _rlgw_stage_report: dict[str, Any] | None = None  # the last stage's outcome

    # ------------------------------------------------------------------ helpers
    def _rlgw_guard_forward(self) -> None:
        """Make every forward step hold the serving lock (once; called between two steps)."""
        if self._rlgw_serving_lock is not None:
            return
        lock = threading.RLock()  # re-entrant: a step may call another guarded method
        for name in FORWARD_METHODS:
            method = getattr(self, name, None)
            if callable(method):
                setattr(self, name, _holding(lock, method))
        self._rlgw_serving_lock = lock

    @contextlib.contextmanager
    def _rlgw_serving_paused(self) -> Iterator[None]:
        """No forward step runs inside this block (parameters may be redirected in it)."""
        lock = self._rlgw_serving_lock
        if lock is None or self._rlgw_stage_thread is not threading.current_thread():
            yield  # staging inside a worker call: no step can run meanwhile anyway
            return
        with lock:
            yield

    def _rlgw_wait_for_stage(self) -> None:
        thread = self._rlgw_stage_thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

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

    def _rlgw_mode(self) -> str:
        forced = os.environ.get(APPLY_MODE_ENV, "").strip().lower()
        if forced in APPLY_MODES:
            return forced
        if not _is_cpu():
            return "inplace"  # CUDA graphs keep the parameters' addresses
        config = getattr(self.model_runner, "model_config", None)
        eager = bool(getattr(config, "enforce_eager", False))
        return "swap" if eager else "inplace"  # a compiled graph may hold the tensors

    def _rlgw_buffer(self, name: str, like: torch.Tensor, device: Any = None) -> torch.Tensor:
        """A tensor shaped like `like` (contents undefined): a pooled one when one fits."""
        device = torch.device(device) if device is not None else like.device
        for i, cand in enumerate((self._rlgw_pool or {}).get(name, [])):
            if (
                cand.shape == like.shape
                and cand.dtype == like.dtype
                and cand.device == device
                and cand.stride() == like.stride()
            ):
                self._rlgw_reused += 1
                return self._rlgw_pool[name].pop(i)  # type: ignore[index]
        return torch.empty_strided(like.shape, like.stride(), dtype=like.dtype, device=device)

    def _rlgw_recycle(self, tensors: dict[str, torch.Tensor]) -> None:
        """Keep tensors nothing serves any more for the next stage (RLGW_WEIGHT_POOL=0: free)."""
        if os.environ.get(POOL_ENV, "1") == "0":
            return
        if self._rlgw_pool is None:
            self._rlgw_pool = {}
        for name, tensor in tensors.items():
            self._rlgw_pool.setdefault(name, []).append(tensor)

    def _rlgw_gemm_modules(self, names: set[str]) -> list[torch.nn.Module]:
        """Modules with a CPU packed GEMM that own one of the named parameters. A tied lm_head
        shares the embedding's parameter but has its own packed copy: it is found by identity."""
        if not _is_cpu():
            return []
        params = self._rlgw_params()
        wanted = {id(params[n]) for n in names if n in params}
        found = []
        for module in self._rlgw_model().modules():
            if not hasattr(module, "cpu_linear") or getattr(module, "weight", None) is None:
                continue
            if any(id(p) in wanted for p in module.parameters(recurse=False)):
                found.append(module)
        return found

    def _rlgw_repack(self, modules: list[torch.nn.Module]) -> None:
        """Rebuild the CPU build's packed copies of these layers' weights from their data."""
        from vllm.model_executor.layers import utils

        for module in modules:
            utils.dispatch_cpu_unquantized_gemm(module, remove_weight=False)

    @torch.no_grad()
    def _rlgw_pack_aside(
        self, modules: list[torch.nn.Module], new_data: dict[str, torch.Tensor]
    ) -> list[_ModuleState]:
        """Pack new weights for these modules without touching what they serve: each module's
        dispatch runs on a stand-in (`_PackingShadow`) that holds the new tensors, so the served
        module is never changed and forward steps go on meanwhile (no serving lock)."""
        from vllm.model_executor.layers import utils

        by_id = {id(p): name for name, p in self._rlgw_params().items()}
        states = []
        for module in modules:
            shadow = _PackingShadow(module, by_id, new_data)
            utils.dispatch_cpu_unquantized_gemm(shadow, remove_weight=False)
            states.append(shadow.state(module, by_id, new_data))
        return states

    @staticmethod
    def _rlgw_set_attrs(states: list[_ModuleState], which: str) -> None:
        for state in states:
            for key, value in getattr(state, which).items():
                if value is _MISSING:
                    state.module.__dict__.pop(key, None)
                else:
                    state.module.__dict__[key] = value

    @torch.no_grad()
    def _rlgw_load_into_scratch(
        self,
        kind: str,
        tensors: dict[str, torch.Tensor],
        targets: frozenset[str] | None,
        phases: _Phases,
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
    def _rlgw_prepare(self, kind: str, tensors: dict[str, torch.Tensor]) -> _Prepared:
        params = self._rlgw_params()
        mode = self._rlgw_mode()
        phases = _Phases()
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
        prepared = _Prepared(kind, mode, self._rlgw_generation, names, {})
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

    def _rlgw_discard_staged(self) -> None:
        prepared, self._rlgw_staged = self._rlgw_staged, None
        if prepared is not None:
            self._rlgw_recycle(prepared.new_data)
            self._rlgw_recycle(prepared.update)
            self._rlgw_recycle(prepared.saved)

    def _rlgw_stage_in_thread(self, path: str, kind: str) -> None:
        nice = yield_cpu_to_serving()
        try:
            with quick_gil_handoff():
                report = {**self._rlgw_stage_now(path, kind), "nice": nice}
            gate = os.environ.get(STAGE_GATE_ENV)
            while gate and not Path(gate).exists():
                time.sleep(0.05)
        except Exception as exc:  # reported, never raised into nowhere
            report = {"ok": False, "error": f"stage failed: {type(exc).__name__}: {exc}"}
        self._rlgw_stage_report = report

    # ------------------------------------------------------------------ rpc methods
    def rlgw_info(self) -> dict[str, Any]:
        """What the trainer's verification needs to know of this server: its dtype."""
        dtype = self.model_runner.model_config.dtype  # type: ignore[attr-defined]
        return {"ok": True, "dtype": str(dtype).removeprefix("torch.")}

    def rlgw_stage(self, path: str, kind: str) -> dict[str, Any]:
        """Start staging an update (read, validate, prepare) without touching the served
        weights; returns at once with "running" (rlgw_stage_status reports the outcome), or
        with the outcome itself when RLGW_STAGE_BACKGROUND=0."""
        if self._rlgw_stage_thread is not None and self._rlgw_stage_thread.is_alive():
            return {"ok": False, "error": "a stage is already in progress"}
        self._rlgw_stage_thread = None
        self._rlgw_discard_staged()  # never two prepared updates in memory at once
        if os.environ.get(STAGE_BACKGROUND_ENV, "1") == "0":
            return self._rlgw_stage_now(path, kind)
        self._rlgw_guard_forward()
        self._rlgw_stage_report = None
        self._rlgw_stage_thread = threading.Thread(
            target=self._rlgw_stage_in_thread, args=(path, kind), name="rlgw-stage", daemon=True
        )
        self._rlgw_stage_thread.start()
        return {"ok": True, "running": True}

    def rlgw_stage_status(self) -> dict[str, Any]:
        """{"ok": True, "running": True} while a stage runs, then its report (ok or error)."""
        thread = self._rlgw_stage_thread
        if thread is not None and thread.is_alive():
            return {"ok": True, "running": True}
        if self._rlgw_stage_report is None:
            return {"ok": False, "error": "nothing is being staged"}
        return self._rlgw_stage_report

    def _rlgw_stage_now(self, path: str, kind: str) -> dict[str, Any]:
        """Read and validate an update and prepare it, without touching the served weights."""
        from safetensors.torch import load_file

        t0, wall0 = time.perf_counter(), time.time()
        problem = self._rlgw_check_weights_kept()
        if problem:
            return {"ok": False, "error": problem}
        if self._rlgw_expected is None:
            self._rlgw_expected = _checkpoint_shapes(
                self.model_runner.model_config.model  # type: ignore[attr-defined]
            )
        t_read = time.perf_counter()
        try:
            if self._rlgw_stage_thread is threading.current_thread():
                tensors = read_tensors(path)  # the GIL free while bytes come in; no copy
            else:
                tensors = load_file(path)
        except Exception as exc:  # a missing or malformed file is a refused update, not a crash
            return {"ok": False, "error": f"cannot read {path}: {exc}"}
        t_validate = time.perf_counter()
        problems = validate_update(tensors, kind, self._rlgw_expected)
        if problems:
            return {"ok": False, "error": "; ".join(problems[:5])}
        t_prepare = time.perf_counter()
        nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
        try:
            prepared = self._rlgw_prepare(kind, tensors)
        except Exception as exc:
            return {"ok": False, "error": f"cannot prepare the update: {exc}"}
        count = len(tensors)
        released = time.time()
        if isinstance(tensors, MappedTensors):
            tensors.drop_pages()
        del tensors
        prepared.info["timeline"].append(("release", released, time.time()))
        self._rlgw_staged = prepared
        phases = {
            "read": t_validate - t_read,
            "validate": t_prepare - t_validate,
            **prepared.info.pop("phases"),
        }
        read_wall = wall0 + (t_read - t0)  # the timeline is in wall-clock seconds (time.time)
        validate_wall = read_wall + phases["read"]
        prepared.info["timeline"] = [
            ("read", read_wall, validate_wall),
            ("validate", validate_wall, validate_wall + phases["validate"]),
            *prepared.info["timeline"],
        ]
        return {
            "ok": True,
            "tensors": count,
            "bytes": nbytes,
            **prepared.info,
            "phases": phases,
            "seconds": time.perf_counter() - t0,
        }

    def rlgw_stage_url(
        self, url: str, sha256: str, kind: str, token: str, path: str = ""
    ) -> dict[str, Any]:
        """`rlgw_stage` of a version file fetched over HTTP (trainer/fetch.py: bearer token,
        resumable, sha256 checked before a tensor is read), or read from `path` when that is a
        file on this host with the same sha256. The download runs in a thread: until it is done
        this answers {"pending": True, "received": bytes} at once (the trainer polls), so the
        server keeps serving meanwhile; then the stage starts (in its own thread: the answer
        says "running", and rlgw_stage_status tells the outcome). Says which delivery it used
        and why."""
        from trainer.fetch import BackgroundFetch, file_digest

        t0 = time.perf_counter()
        done = self._rlgw_fetched
        thread = self._rlgw_stage_thread
        staging = self._rlgw_staged is not None or (thread is not None and thread.is_alive())
        if done is not None and done[0] == sha256.lower() and staging:
            return done[1]  # staged (or staging) already: another worker was still fetching
        fetch = self._rlgw_fetch
        if fetch is None or fetch.sha256 != sha256.lower():  # a new version: path or download?
            reason = "the trainer offered no path"
            if path:
                if not os.path.isfile(path):
                    reason = f"{path} is not readable on this host"
                elif file_digest(Path(path)) != sha256.lower():
                    reason = f"{path} on this host is another file (its sha256 differs)"
                else:
                    why = f"{path} on this host has the version's sha256"
                    staged = self.rlgw_stage(path, kind)
                    return {**staged, "delivery": "path", "delivery_reason": why, "downloaded": 0}
            fetch = self._rlgw_fetch = BackgroundFetch(url, token, sha256, reason)
        report: dict[str, Any] = {"delivery": "http", "delivery_reason": fetch.reason}
        if not fetch.done:
            return {"ok": True, "pending": True, "received": fetch.received(), **report}
        self._rlgw_fetch = None
        if fetch.result is None:
            return {"ok": False, "error": f"{fetch.reason}; fetching it: {fetch.error}", **report}
        fetched = fetch.result
        report["fetch"] = {
            "seconds": fetched.seconds,
            "resumed_from": fetched.resumed_from,
            "attempts": fetched.attempts,
        }
        staged = self.rlgw_stage(str(fetched.path), kind)
        result = {
            **staged,
            **report,
            "downloaded": fetched.bytes_downloaded,
            "seconds": time.perf_counter() - t0,
        }
        self._rlgw_fetched = (fetch.sha256, result) if staged.get("ok") else None
        return result

    def rlgw_fetch_adapter(
        self,
        config_url: str,
        config_sha256: str,
        weights_url: str,
        weights_sha256: str,
        token: str,
        path: str = "",
        keep: str = "",
    ) -> dict[str, Any]:
        """A LoRA adapter's folder on this host, for /v1/load_lora_adapter: the trainer's `path`
        when its two files are on this host with these sha256s, else both files downloaded
        (trainer/fetch.py: bearer token, resumable, each sha256 checked before the folder is
        answered) into <downloads>/adapters/<weights sha256>/. The download runs in a thread:
        until it is done this answers {"pending": True, "received": bytes} at once (the trainer
        polls). `keep`: the folders the server has loaded, one a line; the other downloaded
        adapters are deleted once this one is in. Touches no weights; says which delivery."""
        from trainer.fetch import BackgroundAdapterFetch, adapter_mismatch

        fetch = self._rlgw_adapter_fetch
        wanted = (config_sha256.lower(), weights_sha256.lower())
        if fetch is None or (fetch.config_sha256, fetch.sha256) != wanted:  # path or download?
            reason = "the trainer offered no path"
            if path:
                reason = adapter_mismatch(Path(path), config_sha256, weights_sha256) or ""
                if not reason:
                    why = f"{path} on this host has the version's sha256s"
                    report = {"delivery": "path", "delivery_reason": why, "downloaded": 0}
                    return {"ok": True, "folder": path, **report}
            fetch = self._rlgw_adapter_fetch = BackgroundAdapterFetch(
                (config_url, config_sha256),
                (weights_url, weights_sha256),
                token,
                reason,
                keep=[line for line in keep.splitlines() if line],
            )
        report: dict[str, Any] = {"delivery": "http", "delivery_reason": fetch.reason}
        if not fetch.done:
            return {"ok": True, "pending": True, "received": fetch.received(), **report}
        self._rlgw_adapter_fetch = None
        if fetch.result is None:
            return {"ok": False, "error": f"{fetch.reason}; fetching it: {fetch.error}", **report}
        fetched = fetch.result
        return {
            "ok": True,
            "folder": str(fetched.path),
            "downloaded": fetched.bytes_downloaded,
            "fetch": {
                "seconds": fetched.seconds,
                "resumed_from": fetched.resumed_from,
                "attempts": fetched.attempts,
            },
            **report,
        }

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
        phases = _Phases()
        params = self._rlgw_params()
        if prepared.mode == "swap":
            undo = _Undo(
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
            undo = _Undo("inplace", prepared.names, saved=prepared.saved)
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

    @torch.no_grad()
    def rlgw_checksum(self) -> str:
        """sha256 over the served parameters (vLLM naming, name order, raw bytes)."""
        self._rlgw_wait_for_stage()  # a stage may point parameters at scratch
        digest = hashlib.sha256()
        for name, param in sorted(self._rlgw_params().items()):
            digest.update(name.encode())
            digest.update(param.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes())
        return digest.hexdigest()
