"""Where a version's step time goes (trainer/loop/phases.py): the clock, the slowest backend's
swap phases, and the `[phases]` log line with `other`, what no phase names."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from trainer.loop.phases import (
    PHASES,
    PhaseClock,
    other_seconds,
    phases_line,
    swap_phases,
)

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Swap:
    steps: dict[str, float] = field(default_factory=dict)


def test_the_clock_adds_wall_seconds_per_phase_in_the_fixed_order() -> None:
    clock = PhaseClock()
    with clock.phase("build"):
        time.sleep(0.02)
    with clock.phase("claim"):
        time.sleep(0.01)
    with clock.phase("build"):  # a phase timed twice adds up
        time.sleep(0.02)
    seconds = clock.seconds
    assert list(seconds) == ["claim", "build"]  # PHASES' order, not the order timed
    assert seconds["claim"] >= 0.01
    assert seconds["build"] >= 0.04
    assert seconds["build"] < 5.0  # wall seconds, not milli- or nanoseconds


def test_a_phase_that_raises_is_still_counted() -> None:
    clock = PhaseClock()
    with pytest.raises(RuntimeError), clock.phase("write"):
        time.sleep(0.01)
        raise RuntimeError("disk full")
    assert clock.seconds["write"] >= 0.01


def test_an_unknown_phase_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown phase 'sleep'"):
        PhaseClock().add("sleep", 1.0)


def test_the_updates_timings_move_from_its_metrics_to_their_phases() -> None:
    clock = PhaseClock()
    metrics = {"loss": 0.5, "proximal_s": 0.25, "forward_backward_s": 1.5, "optimizer_s": 0.5}
    clock.take_update(metrics)
    assert metrics == {"loss": 0.5}
    assert clock.seconds == {"proximal": 0.25, "forward_backward": 1.5, "optimizer": 0.5}


def test_the_swap_phases_are_the_slowest_backends_with_steps_summed() -> None:
    fast = Swap(
        {
            "measure_noise": 9.0,  # in no phase: it does not make this backend the slowest
            "stage": 0.5,
            "drain": 0.1,
            "pause": 0.05,
            "apply": 0.2,
            "parity": 0.3,
        }
    )
    slow = Swap(
        {
            "stage": 1.0,
            "drain": 0.25,
            "pause": 0.125,
            "apply": 0.5,
            "reset_cache": 0.0625,
            "resume": 0.0625,
            "parity": 0.75,
            "commit": 0.25,
        }
    )
    skipped = Swap()  # skipped or refused before its stage: no steps
    assert swap_phases([fast, slow, skipped]) == {
        "stage": 1.0,
        "pause": 0.375,  # drain + pause
        "apply": 0.625,  # apply + reset_cache + resume
        "verify": 1.0,  # parity + commit
    }
    assert swap_phases([skipped]) == {} and swap_phases([]) == {}
    clock = PhaseClock()
    clock.add_swaps([fast, slow])
    assert clock.seconds == swap_phases([slow])


def test_other_is_the_step_less_every_phase() -> None:
    assert other_seconds({"claim": 0.25, "write": 0.5}, 2.0) == 1.25
    assert other_seconds({}, 2.0) == 2.0


def test_the_line_names_every_phase_timed_in_order_and_what_is_left() -> None:
    phases = dict.fromkeys(PHASES, 0.0)
    phases.update({"claim": 0.02, "load": 0.31, "forward_backward": 1.5, "verify": 0.7})
    line = phases_line(12, phases, step_s=3.73)
    assert line.startswith("[phases] v12  claim 0.02s  load 0.31s  build 0.00s  proximal 0.00s")
    assert "  forward_backward 1.50s  optimizer 0.00s  " in line
    assert line.endswith("  verify 0.70s  (other 1.20s)")
    words = line.split()  # [phases] v12 name seconds ... (other 1.20s)
    assert words[2:-2:2] == list(PHASES)  # every phase once, in the fixed order
    # a phase not timed (no backends: no swap) is left out, and still nothing is hidden
    line = phases_line(3, {"claim": 0.5, "write": 0.25}, step_s=1.0)
    assert line == "[phases] v3  claim 0.50s  write 0.25s  (other 0.25s)"


def test_the_dashboard_lists_the_phases_in_the_trainers_order() -> None:
    page = (ROOT / "gateway" / "dashboard" / "dashboard.html").read_text()
    listed = re.search(r"const PHASES = \[(.*?)\];", page, re.DOTALL)
    assert listed is not None
    assert tuple(re.findall(r'"(\w+)"', listed.group(1))) == PHASES
