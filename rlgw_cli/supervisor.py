"""`rlgw up` looks after its children. A trainer that exits is reported at once (one line) and
restarted with backoff; it resumes from its saved state (the ledger, its claims and its AdamW
moments, as after any crash). A vLLM server that exits is reported and its backend leaves routing
(state `failed`, with the reason). `/healthz` shows both (`children`)."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from rlgw import backend_state

from .output import info

BACKOFF_FIRST_S = 2.0  # the first restart's wait; doubled after each quick failure
BACKOFF_MAX_S = 60.0
STEADY_S = 120.0  # a trainer that ran this long before exiting is restarted after the first wait


@dataclass
class Child:
    """One supervised process as /healthz shows it."""

    name: str
    proc: subprocess.Popen
    log: Path
    restarts: int = 0
    started: float = field(default_factory=time.monotonic)
    exit_code: int | None = None  # the last exit seen
    note: str | None = None  # what happened, in one line

    def view(self) -> dict[str, Any]:
        return {
            "running": self.proc.poll() is None,
            "pid": self.proc.pid,
            "restarts": self.restarts,
            "last_exit_code": self.exit_code,
            "note": self.note,
            "log": str(self.log),
        }


class Supervisor(threading.Thread):
    """Polls the trainer and the vLLM backend of `rlgw up` until `stop()`."""

    def __init__(
        self,
        *,
        start_trainer: Callable[[], subprocess.Popen],
        trainer_log: Path,
        backend: subprocess.Popen,
        backend_log: Path,
        backend_id: int,
        db: sessionmaker[Session],
        poll_s: float = 1.0,
    ) -> None:
        super().__init__(name="rlgw-supervisor", daemon=True)
        self._start_trainer, self._db, self._backend_id = start_trainer, db, backend_id
        self.trainer = Child("trainer", start_trainer(), trainer_log)
        self.backend = Child("vllm", backend, backend_log)
        self._poll_s = poll_s
        self._stopping = threading.Event()
        self._restart_at: float | None = None
        self._lock = threading.Lock()

    def report(self) -> dict[str, Any]:
        """The children as /healthz shows them."""
        with self._lock:
            return {"trainer": self.trainer.view(), "vllm": self.backend.view()}

    def stop(self) -> subprocess.Popen:
        """Stop watching (before the children are stopped on purpose); the current trainer."""
        self._stopping.set()
        self.join(timeout=5)
        return self.trainer.proc

    def run(self) -> None:
        while not self._stopping.wait(self._poll_s):
            with self._lock:
                self._watch_trainer()
                self._watch_backend()

    def _watch_trainer(self) -> None:
        child = self.trainer
        now = time.monotonic()
        if self._restart_at is not None:
            if now >= self._restart_at:
                self._restart_at = None
                child.proc, child.started = self._start_trainer(), now
                child.restarts += 1
                child.note = f"restarted ({child.restarts} so far)"
            return
        code = child.proc.poll()
        if code is None:
            return
        quick = now - child.started < STEADY_S
        wait = min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2 ** (child.restarts if quick else 0))
        child.exit_code = code
        child.note = f"exited with code {code}; restarting in {wait:.0f}s"
        info(
            f"[rlgw] the trainer exited with code {code} (log: {child.log}); restart in {wait:.0f}s"
        )
        self._restart_at = now + wait

    def _watch_backend(self) -> None:
        child = self.backend
        if child.exit_code is not None or (code := child.proc.poll()) is None:
            return
        child.exit_code = code
        child.note = f"exited with code {code}: its backend is out of routing"
        info(f"[rlgw] vLLM exited with code {code} (log: {child.log}); its backend left routing")
        reason = f"the vLLM process of rlgw up exited with code {code} (log: {child.log})"
        try:
            with self._db() as db, db.begin():
                backend_state.fail(db, self._backend_id, reason)
        except Exception as exc:  # the database may be gone too: say so, keep watching
            info(f"[rlgw] could not mark the backend failed: {type(exc).__name__}: {exc}")
