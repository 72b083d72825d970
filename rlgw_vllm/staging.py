"""Staging an update: read, validate and prepare it while the backend serves, in a background
thread at a low CPU priority (or inside the call with RLGW_STAGE_BACKGROUND=0)."""

from __future__ import annotations

import threading
import time
from typing import Any

from rlgw import test_hooks
from rlgw.weight_files import checkpoint_shapes, validate_update

from .cpu_priority import quick_gil_handoff, yield_cpu_to_serving
from .preparing import Preparing
from .safetensors_read import MappedTensors, read_tensors
from .settings import WorkerSettings


class Staging(Preparing):
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
            test_hooks.stage_gate()
        except Exception as exc:  # reported, never raised into nowhere
            report = {"ok": False, "error": f"stage failed: {type(exc).__name__}: {exc}"}
        self._rlgw_stage_report = report

    def rlgw_stage(self, path: str, kind: str) -> dict[str, Any]:
        """Start staging an update (read, validate, prepare) without touching the served
        weights; returns at once with "running" (rlgw_stage_status reports the outcome), or
        with the outcome itself when RLGW_STAGE_BACKGROUND=0."""
        if self._rlgw_stage_thread is not None and self._rlgw_stage_thread.is_alive():
            return {"ok": False, "error": "a stage is already in progress"}
        self._rlgw_stage_thread = None
        self._rlgw_discard_staged()  # never two prepared updates in memory at once
        if WorkerSettings().stage_background == "0":
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
            self._rlgw_expected = checkpoint_shapes(
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
