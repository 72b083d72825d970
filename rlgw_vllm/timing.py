"""Seconds per phase of a stage or an apply, for the reports the trainer logs."""

from __future__ import annotations

import time


class Phases:
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
