"""A version published in the background while the next update computes: at most one in flight.

The trainer hands over a `PendingVersion` whose every tensor is its own (a delta, a copy of the
full weights, a frozen adapter, a copy of the AdamW moments), so that the next update may change
the model and the optimizer while this version's file is written, checksummed, committed and
swapped in. What goes wrong in the background (a lost claim, a conflicting version, a database
error) is raised again on the trainer's own thread when it collects the outcome (`finish`), where
the rest of the trainer (other ranks' collectives included) is safe to touch.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from ..backends.parity import ProbeScores
from ..publishing.publish import Published
from ..swap.coordinator import SwapReport
from ..weight_update.base import WeightUpdate
from .phases import PhaseClock


@dataclass
class PendingVersion:
    """Everything needed to record and push one trained version. In the background
    (`OnlineTrainer._launch`), none of it is shared with the model or the optimizer that go on
    training; on the trainer's own thread, `weights` is the model itself."""

    parent: int  # the version it was trained from
    payload: Any  # kind.write's input: tensors, or a frozen adapter (in the background)
    kind: type[WeightUpdate]
    metrics: dict[str, Any]  # its update's; the report's
    session_ids: list[str]  # its claim
    ledger: Callable[[Any, int], None]  # rows(db, version): its ledger
    moments: dict | None  # the optimizer state it reached, as save_moments takes it
    weights: Any  # what holds its full weights: the model, or (in the background) a copy
    reference_old: ProbeScores  # the probe scores of its parent's weights
    clock: PhaseClock
    started: float  # perf_counter at its claim
    claimed_at: datetime
    report_args: tuple = ()  # (claim, trajectories, samples, skips), for its report
    expected: int = 0  # the number it will get (in the background: the next one free)
    reference_new: ProbeScores | None = None  # its own probe scores; None: from `weights`
    # In the background: perf_counter once its publish returned (every backend serves it), so
    # that its step_s does not hold the next update it overlapped. None: in line (step_s then
    # runs to its report, a gate's verdict and a colocated hold included).
    served: float | None = None


@dataclass
class Outcome:
    """What became of a pending version: recorded and pushed, or the error that stopped it."""

    pending: PendingVersion
    published: Published | None = None
    swaps: list[SwapReport] = field(default_factory=list)
    error: BaseException | None = None


class InFlight:
    """One pending version being published by `publish(pending) -> (published, swaps)` on a
    thread of its own (not a daemon: a trainer that exits finishes the version first)."""

    def __init__(
        self,
        pending: PendingVersion,
        publish: Callable[[PendingVersion], tuple[Published, list[SwapReport]]],
    ) -> None:
        self.outcome = Outcome(pending)
        self._publish = publish
        self._thread = threading.Thread(
            target=self._run, name=f"publish-v{pending.expected}", daemon=False
        )
        self._thread.start()

    def _run(self) -> None:
        try:
            self.outcome.published, self.outcome.swaps = self._publish(self.outcome.pending)
            self.outcome.pending.served = time.perf_counter()
        except BaseException as exc:  # noqa: BLE001 - raised again on the trainer's thread
            self.outcome.error = exc

    def done(self) -> bool:
        return not self._thread.is_alive()

    def join(self) -> Outcome:
        self._thread.join()
        return self.outcome


class FrozenAdapter:
    """A peft model's adapter as it is now, written later the way `save_pretrained` writes it
    (the adapter's safetensors and its config), while the model itself trains on."""

    def __init__(self, model: torch.nn.Module) -> None:
        from peft import get_peft_model_state_dict

        self.tensors = {
            k: v.detach().to("cpu", copy=True).contiguous()
            for k, v in get_peft_model_state_dict(model).items()
        }
        self.config = copy.deepcopy(model.peft_config["default"])
        self.config.inference_mode = True  # as PeftModel.save_pretrained saves it

    def save_pretrained(self, path: str, safe_serialization: bool = True) -> None:
        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        save_file(self.tensors, str(folder / "adapter_model.safetensors"), {"format": "pt"})
        self.config.save_pretrained(str(folder))
