"""Time-sharing for a colocated placement: the model's backends leave routing while the trainer
updates, so it has the cores (or, on GPUs, the device) to itself.

    hold:    active backends -> draining (reason HOLD_REASON; every gateway stops routing to
             them and holds new requests, bounded by RLGW_BACKEND_HOLD_S), wait until vLLM has
             nothing running, then put it to sleep (level 1; a no-op on the CPU build)
    wake:    wake vLLM up before the swap (the swap needs it serving its probe)
    release: every backend still draining for the hold goes back to active; a backend the swap
             moved on (active on the new version, failed, ...) is left as the swap left it

Requests that wait at the gateway are leased after the release, so they run on the version
then served: none is stamped with the wrong one. Sleep and wake follow vLLM's documented dev-mode
API (`POST /sleep?level=1&mode=wait`, `POST /wake_up`); on GPUs they are experimental (never run
here: no GPU build of vLLM runs on our machines).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
from sqlalchemy import and_, func, update

from rlgw import backend_state as bs
from rlgw.db.models import Backend
from trainer.backends.vllm_control import ControlError, VllmControl

from .coordinator import SwapCoordinator

HOLD_REASON = "colocated: generation paused while the trainer updates"


@dataclass
class HoldReport:
    backends: list[int] = field(default_factory=list)  # the ones held
    drain_s: float = 0.0  # until vLLM ran nothing
    sleep_s: float = 0.0
    wake_s: float = 0.0
    held_s: float = 0.0  # out of routing for the hold, in all
    drained: bool = True  # False: the drain timed out (requests still ran when training began)
    problems: list[str] = field(default_factory=list)  # sleep/wake failures (the hold goes on)


class GenerationHold:
    """`with GenerationHold(coordinator, model_id) as hold: train; hold.wake(); swap`."""

    def __init__(
        self,
        coordinator: SwapCoordinator,
        model_id: int,
        *,
        sleep_level: int | None = 1,
        log: Callable[[str], None] = print,
    ) -> None:
        self.coordinator, self.model_id, self.sleep_level, self.log = (
            coordinator,
            model_id,
            sleep_level,
            log,
        )
        self.report = HoldReport()
        self._urls: dict[int, str] = {}
        self._asleep = False
        self._t0 = 0.0

    def __enter__(self) -> GenerationHold:
        self._t0 = time.perf_counter()
        for backend in self.coordinator.backends(self.model_id):
            if backend.state == bs.ACTIVE:
                self.coordinator.set_state(backend.id, bs.DRAINING, HOLD_REASON)
                self._urls[backend.id] = backend.url
        self.report.backends = sorted(self._urls)
        self._drain()
        if self.sleep_level is not None:
            t0 = time.perf_counter()
            self._each("sleep", lambda v: v.sleep(self.sleep_level))
            self._asleep = True
            self.report.sleep_s = time.perf_counter() - t0
        return self

    def _control(self, url: str) -> VllmControl:
        return VllmControl(self.coordinator.http, url)

    def _drain(self) -> None:
        t0 = time.perf_counter()
        deadline = t0 + self.coordinator.drain_timeout_s
        pending = dict(self._urls)
        while pending and time.perf_counter() < deadline:
            for backend_id, url in list(pending.items()):
                try:
                    if self._control(url).requests_in_flight() == 0:
                        del pending[backend_id]
                except httpx.HTTPError:
                    del pending[backend_id]  # unreachable: nothing runs there for us to wait on
            if pending:
                time.sleep(0.02)
        self.report.drained = not pending
        self.report.drain_s = time.perf_counter() - t0

    def _each(self, what: str, call: Callable[[VllmControl], None]) -> None:
        for backend_id, url in self._urls.items():
            try:
                call(self._control(url))
            except (ControlError, httpx.HTTPError) as exc:
                problem = f"backend {backend_id}: {what} failed: {exc}"
                self.report.problems.append(problem)
                self.log(f"[hold] {problem}")

    def wake(self) -> None:
        """Wake the backends up (before the swap: it needs them serving)."""
        if self._asleep:
            t0 = time.perf_counter()
            self._each("wake_up", VllmControl.wake_up)
            self._asleep = False
            self.report.wake_s = time.perf_counter() - t0

    def __exit__(self, *exc: object) -> None:
        self.wake()  # an update that failed still gives the backends back
        if self._urls:
            with self.coordinator.db_sessions() as db, db.begin():
                released = db.scalars(
                    update(Backend)
                    .where(
                        and_(
                            Backend.id.in_(self._urls),
                            Backend.state == bs.DRAINING,
                            Backend.state_reason == HOLD_REASON,
                        )
                    )
                    .values(state=bs.ACTIVE, state_reason=None, updated_at=func.now())
                    .returning(Backend.id)
                ).all()
                for backend_id in released:
                    db.execute(bs.NOTIFY, bs.notify_args(backend_id))
        self.report.held_s = time.perf_counter() - self._t0


class NoHold:
    """The hold of the placements that do not pause generation: nothing is held."""

    report = None

    def __enter__(self) -> NoHold:
        return self

    def wake(self) -> None:
        pass

    def __exit__(self, *exc: object) -> None:
        pass
