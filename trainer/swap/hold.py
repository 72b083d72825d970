"""Time-sharing for a colocated placement: the model's backends stop generating while the trainer
updates, so it has the cores (or, on GPUs, the device) to itself.

    hold:    active backends -> draining (reason HOLD_REASON; every gateway stops routing to
             them and holds new requests, bounded by RLGW_BACKEND_HOLD_S), vLLM paused in place
             (`keep`: the answers in flight stay in the engine, frozen mid-answer), then, with
             `sleep_level`, put to sleep (keeping them)
    wake:    wake vLLM up before the swap (the swap needs it serving its probe); the answers
             in flight stay paused in place for the swap's stage
    release: every backend still draining for the hold goes back to active, and vLLM resumes
             (unless a swap failed it): the frozen answers go on, from the version the swap
             installed, the swap's boundary recording where each was cut

Nothing waits for the answers in flight (the hold is bounded by the update, however long the
answers): until 2026-12-07 it waited until vLLM ran nothing (docs/benchmarks.md, "The colocated
hold pauses in place"). vLLM's sleep is asked for only where it frees a device (a CUDA trainer):
on the CPU build it only pauses the scheduler, and its wake-up resumes it. Requests that wait
at the gateway are leased after the release, on the version then served: none is stamped with
the wrong one. Sleep and wake follow vLLM's documented dev-mode API (`POST /sleep?level=1&mode=
keep`, `POST /wake_up`); on GPUs they are experimental (never run here: no GPU build of vLLM runs
on our machines).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
from sqlalchemy import and_, func, select, update

from rlgw import backend_state as bs
from rlgw.db.models import Backend
from trainer.backends.vllm_control import ControlError, VllmControl

from .coordinator import SwapCoordinator

HOLD_REASON = "colocated: generation paused while the trainer updates"


@dataclass
class HoldReport:
    backends: list[int] = field(default_factory=list)  # the ones held
    sleep_s: float = 0.0
    wake_s: float = 0.0
    held_s: float = 0.0  # out of routing for the hold, in all
    problems: list[str] = field(default_factory=list)  # pause/sleep/wake failures (it goes on)


class GenerationHold:
    """`with GenerationHold(coordinator, model_id) as hold: train; record; hold.wake(); swap`."""

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
        self._each("pause", lambda v: v.pause("keep"))
        if self.sleep_level is not None:
            t0 = time.perf_counter()
            self._each("sleep", lambda v: v.sleep(self.sleep_level))
            self._asleep = True
            self.report.sleep_s = time.perf_counter() - t0
        return self

    def _control(self, url: str) -> VllmControl:
        return VllmControl(self.coordinator.http, url)

    def _each(self, what: str, call: Callable[[VllmControl], None]) -> None:
        for backend_id in self._urls:
            self._call(backend_id, what, call)

    def _call(self, backend_id: int, what: str, call: Callable[[VllmControl], None]) -> None:
        try:
            call(self._control(self._urls[backend_id]))
        except (ControlError, httpx.HTTPError) as exc:
            problem = f"backend {backend_id}: {what} failed: {exc}"
            self.report.problems.append(problem)
            self.log(f"[hold] {problem}")

    def wake(self) -> None:
        """Wake the backends up before the swap (it needs them serving its probe). vLLM's wake-up
        resumes its scheduler: the answers in flight are paused in place again at once, so that
        the swap's stage has the cores and its pause cuts them where the hold did."""
        if self._asleep:
            t0 = time.perf_counter()
            self._each("wake_up", VllmControl.wake_up)
            self._each("pause", lambda v: v.pause("keep"))
            self._asleep = False
            self.report.wake_s = time.perf_counter() - t0

    def __exit__(self, *exc: object) -> None:
        """Generation goes on, whether the update succeeded or not: every backend still held is
        resumed and goes back to active (one the swap moved is left as the swap left it)."""
        self.wake()
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
                failed = set(
                    db.scalars(
                        select(Backend.id).where(
                            Backend.id.in_(self._urls), Backend.state == bs.FAILED
                        )
                    ).all()
                )
            # Resumed unless a swap failed it (it then ended what it held, or keeps it paused on
            # purpose); one the swap served is running already, and a resume changes nothing.
            # vLLM queues what is routed to it before its resume.
            for backend_id in self._urls:
                if backend_id not in failed:
                    self._call(backend_id, "resume", VllmControl.resume)
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
