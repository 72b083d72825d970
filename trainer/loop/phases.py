"""Where a version's step time goes: wall seconds per named phase, in one fixed order, for its log
line, its row (`metrics.phases`), TensorBoard (`phase/<name>`) and the dashboard.

The phases, in order (docs/training.md, "Metrics"):
- claim: the claim transaction; load: the trajectories, lineage, task means and advantages;
  build: the samples;
- proximal, forward_backward, optimizer: `policy_update`'s own sums (the extra forward pass for
  pi_prox when one is needed; every micro-batch's forward and backward; the clip and the
  optimizer step, summed over steps);
- gather: the updated weights and AdamW moments; delta: the version's payload;
- launch (published in the background only): the probe scores of its weights and the copies of
  its weights and AdamW moments it takes along (trainer/loop/version_publishing.py);
- write, checksum, commit: `Publisher.record`'s (the payload file, its sha256, the version row
  with the ledger and the transaction's commit); moments: saving the AdamW moments it reached;
- stage, pause, apply, verify: the swap's, from the SLOWEST backend's report (the largest sum of
  these four), as one backend's swap is what a request sees: pause = drain + pause + boundary
  (the counts of the requests held), apply = apply + reset_cache + resume, verify = parity +
  commit. Backends swap one after another, so
  the other backends' swaps are in `other`, like everything no phase names.

Stdlib only: the update path imports it (tests/unit/test_light_imports.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Protocol

PHASES = (
    "claim",
    "load",
    "build",
    "proximal",
    "forward_backward",
    "optimizer",
    "gather",
    "delta",
    "launch",
    "write",
    "checksum",
    "commit",
    "moments",
    "stage",
    "pause",
    "apply",
    "verify",
)
# policy_update's metric -> its phase (the trainer moves them from the metrics to the phases)
UPDATE_PHASES = {
    "proximal_s": "proximal",
    "forward_backward_s": "forward_backward",
    "optimizer_s": "optimizer",
}
# a swap phase -> the coordinator's steps it sums (SwapReport.steps)
SWAP_PHASES = {
    "stage": ("stage",),
    "pause": ("drain", "pause", "boundary"),
    "apply": ("apply", "reset_cache", "resume"),
    "verify": ("parity", "commit"),
}


class _Swap(Protocol):
    steps: dict[str, float]


class PhaseClock:
    """Wall seconds per phase (`time.perf_counter`); a phase timed twice adds up."""

    def __init__(self) -> None:
        self._seconds: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the block as `name` (counted even when it raises)."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - started)

    def add(self, name: str, seconds: float) -> None:
        if name not in PHASES:
            raise ValueError(f"unknown phase {name!r}; the phases are {', '.join(PHASES)}")
        self._seconds[name] = self._seconds.get(name, 0.0) + float(seconds)

    def take_update(self, metrics: dict[str, float]) -> None:
        """Move policy_update's timings (`proximal_s`, ...) from its metrics to their phases."""
        for key, name in UPDATE_PHASES.items():
            if key in metrics:
                self.add(name, metrics.pop(key))

    def add_swaps(self, reports: Iterable[_Swap]) -> None:
        """The swap phases of the slowest backend (see the module's docstring); none without a
        backend that took a step."""
        for name, seconds in swap_phases(reports).items():
            self.add(name, seconds)

    @property
    def seconds(self) -> dict[str, float]:
        """{phase: seconds} of the phases timed, in PHASES' order."""
        return {name: self._seconds[name] for name in PHASES if name in self._seconds}


def swap_phases(reports: Iterable[_Swap]) -> dict[str, float]:
    """{stage, pause, apply, verify: seconds} of the backend whose four add up to the most; {}
    when no backend took any of their steps (none, or every one skipped before its stage)."""
    per_backend = [
        {name: sum(r.steps.get(step, 0.0) for step in steps) for name, steps in SWAP_PHASES.items()}
        for r in reports
        if any(step in r.steps for steps in SWAP_PHASES.values() for step in steps)
    ]
    return max(per_backend, key=lambda p: sum(p.values()), default={})


def other_seconds(phases: Mapping[str, float], step_s: float) -> float:
    """What no phase names: the step's seconds less the phases' sum."""
    return step_s - sum(phases.values())


def phases_line(version: int, phases: Mapping[str, float], step_s: float) -> str:
    """`[phases] v12  claim 0.02s  load 0.31s  ...  verify 0.70s  (other 1.20s)`."""
    timed = "  ".join(f"{name} {phases[name]:.2f}s" for name in PHASES if name in phases)
    return f"[phases] v{version}  {timed}  (other {other_seconds(phases, step_s):.2f}s)"
