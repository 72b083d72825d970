"""The settings of the code inside a vLLM backend, read from RLGW_* environment variables.

A worker reads them when it acts (a stage, a download), not at import, so a variable set for one
server process applies to it. The backend's own `rlgw backend` process sets some of them
(rlgw/backend_launcher.py); the gateway's `Settings` is not needed inside vLLM.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from rlgw.settings import HomeSettings

APPLY_MODES = ("swap", "inplace")
STAGE_NICE_ENV = "RLGW_STAGE_NICE"


class WorkerSettings(HomeSettings):
    """RLGW_HOME (downloads go to <home>/downloads) and how a worker stages and applies."""

    model_config = SettingsConfigDict(env_prefix="RLGW_", extra="ignore")

    weight_apply: str = Field(
        default="",
        description='How an update is applied: "swap" or "inplace" (see rlgw_vllm/extension.py). '
        "Empty (or anything else): swap on a CPU build with eager execution, else inplace.",
    )
    weight_pool: str = Field(
        default="1",
        description="0: free the tensors that stop being served instead of keeping them for the "
        "next stage.",
    )
    stage_background: str = Field(
        default="1",
        description="0: stage inside the call (the engine loop waits) instead of in a thread.",
    )
    stage_nice: int = Field(
        default=19, description="Nice value of a backend's background work (0: off)."
    )
    stage_switch_interval_s: float = Field(
        default=0.001, description="The GIL hand-off interval while a stage runs (seconds)."
    )
    vllm_keep_weights: str = Field(
        default="",
        description="1 (set by `rlgw backend`): the plugin keeps the CPU build's linear weights.",
    )

    def apply_mode(self) -> str | None:
        """The forced apply mode, or None to choose by platform."""
        forced = self.weight_apply.strip().lower()
        return forced if forced in APPLY_MODES else None
