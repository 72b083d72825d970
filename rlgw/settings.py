"""One settings object for gateway, trainer and CLI, read from RLGW_* environment variables."""

from __future__ import annotations

import ipaddress
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_ADMIN_KEY = "change-me"


def is_loopback_host(host: str) -> bool:
    """True when `host` names only this machine (127.0.0.0/8, ::1 or localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Settings(BaseSettings):
    """Runtime configuration. Every field can be set as RLGW_<NAME> in the environment."""

    model_config = SettingsConfigDict(env_prefix="RLGW_", extra="ignore")

    home: Path = Field(
        default=Path.home() / ".rlgw",
        description="State directory: embedded Postgres data, generated models, logs.",
    )
    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL (postgresql+psycopg://...). Empty: start an embedded Postgres "
        "under <home>/pgdata.",
    )
    host: str = Field(default="127.0.0.1", description="Gateway bind address.")
    port: int = Field(default=8000, ge=1, le=65535, description="Gateway port.")
    public_url: str | None = Field(
        default=None,
        description="Base URL agents use to reach the gateway (for session base_url values). "
        "Default: the URL the creating request used.",
    )
    admin_key: str = Field(
        default=DEFAULT_ADMIN_KEY,
        description="Key for /admin/* and other control endpoints (Bearer or X-Admin-Key).",
    )
    upstream_timeout_s: float = Field(
        default=600.0, gt=0, description="Read timeout for one backend response."
    )
    upstream_connect_timeout_s: float = Field(default=5.0, gt=0)
    max_body_bytes: int = Field(
        default=4 * 1024 * 1024, gt=0, description="Largest request body accepted (bytes)."
    )
    record_queue_size: int = Field(
        default=10_000, gt=0, description="Completion records waiting to be written, at most."
    )
    record_batch_size: int = Field(
        default=128, gt=0, description="Completion records written per database round trip."
    )
    reward_normalization: Literal["none", "mean", "mean_std"] = Field(
        default="mean_std",
        description="Default per-group normalization of session returns (a group may choose its "
        "own at creation). A group of one always keeps its raw reward.",
    )
    group_deadline_s: float = Field(
        default=3600.0,
        gt=0,
        description="Seconds after a group's creation by which every member must be rewarded; "
        "a group still missing a reward then is dropped, with the reason recorded.",
    )
    drain_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="How long a swap waits for a backend's in-flight requests before aborting "
        "them (aborted requests are recorded incomplete, never trained on).",
    )
    parity_tolerance: float = Field(
        default=1e-4,
        gt=0,
        description="Largest |served - reference| probe log-prob accepted after a swap "
        "(1e-4 suits fp32 serving; bf16 needs a looser bound).",
    )
    backend_refresh_s: float = Field(
        default=5.0, gt=0, description="How often each gateway re-reads the backend registry."
    )

    @field_validator("database_url")
    @classmethod
    def _normalise_url(cls, url: str | None) -> str | None:
        """Accept plain postgres:// URLs and use the psycopg (v3) driver for them."""
        if not url:
            return None
        for prefix in ("postgres://", "postgresql://"):
            if url.startswith(prefix):
                return "postgresql+psycopg://" + url[len(prefix) :]
        if not url.startswith("postgresql+psycopg://"):
            raise ValueError("RLGW_DATABASE_URL must be a postgresql:// URL")
        return url

    @model_validator(mode="after")
    def _refuse_unsafe_exposure(self) -> Settings:
        if not is_loopback_host(self.host) and self.admin_key in ("", DEFAULT_ADMIN_KEY):
            raise ValueError(
                f"refusing to bind {self.host} with an empty or default admin key: "
                "set RLGW_ADMIN_KEY to a long random secret"
            )
        return self

    @property
    def base_url(self) -> str:
        return self.public_url or f"http://{self.host}:{self.port}"


@lru_cache
def get_settings() -> Settings:
    return Settings()
