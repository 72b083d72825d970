"""The test hooks: the points where a test makes a process crash, wait or hold on demand, which a
real run cannot produce when wanted (a crash between two writes, a slow commit, a stage held open).

Production code calls these functions unconditionally; each is a no-op unless its RLGW_TEST_* /
RLGW_TRAINER_FAULT variable is set, which no deployment does. They live here, in one place, so
that no production path branches on a test variable. Both the trainer and the code inside a vLLM
backend (rlgw_vllm) call them, hence the ground floor.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

FAULT_ENV = "RLGW_TRAINER_FAULT"
COMMIT_DELAY_ENV = "RLGW_TEST_COMMIT_DELAY_S"
STAGE_GATE_ENV = "RLGW_TEST_STAGE_GATE"
NAN_LOSS_ENV = "RLGW_TEST_NAN_LOSS_STEP"


class TestHooks(BaseSettings):
    """The hooks' variables, read when a hook runs (a test sets them for one process)."""

    __test__ = False  # not a pytest test class, despite its name

    model_config = SettingsConfigDict(env_prefix="RLGW_", extra="ignore")

    trainer_fault: str = Field(
        default="",
        description='The point where the trainer exits at once: "crash-before-commit" or '
        '"crash-after-commit".',
    )
    test_commit_delay_s: float = Field(
        default=0.0, description="Seconds rank 0 waits before it records a version."
    )
    test_stage_gate: str = Field(
        default="",
        description="A file: a backend's background stage, once prepared, waits while it is "
        "absent, so that a test can send requests while a stage is certainly in progress (a "
        "real stage of the tiny model ends in milliseconds: no other way to hold one open).",
    )
    test_nan_loss_step: int = Field(
        default=0,
        description="The optimizer step of an update (1: its first, counting minibatches over "
        "epochs) whose loss `nan_loss` makes NaN, as an overflowing reward would; 0: none.",
    )


def crash_point(point: str) -> None:
    """Exit the process at once (code 86, no cleanup) when RLGW_TRAINER_FAULT names `point`."""
    if TestHooks().trainer_fault == point:
        print(f"[train] injected fault: {point}", flush=True)
        os._exit(86)


def commit_delay() -> None:
    """Wait RLGW_TEST_COMMIT_DELAY_S seconds (a big model's commit, alone)."""
    time.sleep(TestHooks().test_commit_delay_s)


def stage_gate() -> None:
    """Wait while the file RLGW_TEST_STAGE_GATE names is absent."""
    gate = TestHooks().test_stage_gate
    while gate and not Path(gate).exists():
        time.sleep(0.05)


def nan_loss(loss: Any, step: int) -> Any:
    """`loss` times NaN at the update's optimizer step RLGW_TEST_NAN_LOSS_STEP names (from 1),
    `loss` itself otherwise (a tensor or a number: no torch import here)."""
    if step and TestHooks().test_nan_loss_step == step:
        return loss * float("nan")
    return loss
