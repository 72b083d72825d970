"""One settings object for gateway, trainer and CLI, read from RLGW_* environment variables."""

from __future__ import annotations

import ipaddress
import os
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from rlgw.netguard import parse_allowlist

DEFAULT_ADMIN_KEY = "change-me"
DEFAULT_TOKEN_SECRET = "change-me-token-secret"
# Networks a backend may live on when RLGW_BACKEND_ALLOWLIST is not set: this machine only.
DEFAULT_BACKEND_ALLOWLIST = "127.0.0.0/8,::1/128"


def is_loopback_host(host: str) -> bool:
    """True when `host` names only this machine (127.0.0.0/8, ::1 or localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class HomeSettings(BaseSettings):
    """RLGW_HOME, read here only: `Settings` (gateway, trainer, CLI) and the backends' worker
    settings (rlgw_vllm/settings.py: a vLLM worker keeps its downloads under it) extend this."""

    model_config = SettingsConfigDict(env_prefix="RLGW_", extra="ignore")

    home: Path = Field(
        default=Path.home() / ".rlgw",
        description="State directory: embedded Postgres data, generated models, logs.",
    )


class Settings(HomeSettings):
    """Runtime configuration. Every field can be set as RLGW_<NAME> in the environment."""

    model_config = SettingsConfigDict(env_prefix="RLGW_", extra="ignore")

    model_cache: Path = Field(
        default_factory=lambda: (
            Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rlgw" / "models"
        ),
        description="Where pretrained models are fetched and converted once, for every home "
        "(<home>/models/<name> links there).",
    )
    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL (postgresql+psycopg://...). Empty: start an embedded Postgres "
        "under <home>/pgdata.",
    )
    host: str = Field(default="127.0.0.1", description="Gateway bind address.")
    port: int = Field(default=8000, ge=1, le=65535, description="Gateway port.")
    keep_alive_s: float = Field(
        default=75.0,
        gt=0,
        description="How long an idle client connection is kept open. Longer than the clients' "
        "own pool expiry (httpx, hence the openai SDK: 5 s) so that the client always closes "
        "first; an equal or shorter value races a reused connection against the server's close.",
    )
    public_url: str | None = Field(
        default=None,
        description="Base URL agents use to reach the gateway (for session base_url values). "
        "Default: the URL the creating request used.",
    )
    admin_key: str = Field(
        default=DEFAULT_ADMIN_KEY,
        description="Key for /admin/* and other control endpoints (Bearer or X-Admin-Key).",
    )
    auth: Literal["on", "off"] = Field(
        default="on",
        description="on: every agent call needs an agent key or a session token, and sessions "
        "belong to the key's tenant. off: the open mode for local use (no keys, no tenants); "
        "refused on a non-loopback bind.",
    )
    token_secret: str = Field(
        default=DEFAULT_TOKEN_SECRET,
        description="HS256 secret that signs session tokens (required when auth is on). On a "
        "loopback bind the default is replaced by a random per-process secret; a non-loopback "
        "bind refuses an empty or default one. Set the same value on every replica.",
    )
    session_token_max_ttl_s: int = Field(
        default=86_400, gt=0, description="Longest lifetime a session token may be minted with."
    )
    auth_cache_s: float = Field(
        default=5.0,
        ge=0,
        description="How long a replica caches a verified agent key. A revocation takes effect at "
        "once on the replica that served it and within this time on the others.",
    )
    backend_allowlist: str = Field(
        default=DEFAULT_BACKEND_ALLOWLIST,
        description="Where backends may be registered: comma-separated networks (CIDR or single "
        "addresses) and host names. A target's resolved addresses must all fall in a listed "
        "network, or its name must be listed. Link-local (cloud metadata) addresses need a "
        "network entry inside 169.254.0.0/16 or fe80::/10 even then.",
    )
    max_tokens_cap: int = Field(
        default=32_768,
        gt=0,
        description="Largest max_tokens / max_completion_tokens a request may ask for (400 above).",
    )
    max_n: int = Field(
        default=16,
        gt=0,
        description="Most choices (n) one request may ask for; each is recorded as a completion of "
        "its own (400 above).",
    )
    rate_limit_rps: float = Field(
        default=100.0,
        ge=0,
        description="Sustained requests per second per key (token bucket; 0 disables, explicitly). "
        "With auth off, per client address. Each replica enforces its own bucket.",
    )
    rate_limit_burst: int = Field(
        default=200, gt=0, description="Bucket size: requests a key may send at once."
    )
    max_concurrency_per_key: int = Field(
        default=128,
        ge=0,
        description="Requests one key may have in flight at once in a replica (0 disables).",
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
    record_retry_s: float = Field(
        default=5.0,
        ge=0,
        description="How long a completion's callers wait while its record cannot be written "
        "because the database is unreachable (restarting, cut off): the write is retried with "
        "backoff meanwhile, so a shorter outage is ridden out. After it the call fails with 503 "
        "database_unavailable and the record is not written later; one whose last commit may "
        "have landed is marked ineligible once the database is back (docs/architecture.md).",
    )
    database_connect_timeout_s: float = Field(
        default=5.0,
        ge=2,
        description="Longest wait for a new database connection (libpq connect_timeout, whole "
        "seconds, at least 2): a database that does not answer fails requests with 503 after "
        "it instead of hanging them.",
    )
    reward_normalization: Literal["none", "mean", "mean_std"] = Field(
        default="mean_std",
        description="Default per-group normalization of session returns (a group may choose its "
        "own at creation). A group of one always keeps its raw reward.",
    )
    reward_min: float = Field(
        default=-1e6,
        allow_inf_nan=False,
        description="The smallest reward the API accepts; a lower value is refused with 422. "
        "Bounded by default so that a tenant's typo (1e308) cannot overflow a group's "
        "normalization; widen it if your rewards are larger.",
    )
    reward_max: float = Field(
        default=1e6,
        allow_inf_nan=False,
        description="The largest reward the API accepts; a higher value is refused with 422.",
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
        description="How long the colocated placement's hold, and a LoRA swap, wait for the "
        "answers in flight (the hold before training on the cores they use, the LoRA swap "
        "before its parity probe; what still runs then is ended). A full-weight swap waits for "
        "none: it pauses them in place and they continue on the new weights.",
    )
    colocated_batch_wait_s: float = Field(
        default=60.0,
        ge=0,
        description="How long a colocated trainer waits for a full batch (batch_sessions, or as "
        "full as whole groups allow) before it trains what is eligible: each update pauses "
        "generation, so it waits for a full one while generation runs on every core. 0: an "
        "update starts as soon as min_sessions are eligible, as in the other placements.",
    )
    parity_tolerance: float = Field(
        default=1e-4,
        gt=0,
        description="Largest |served - reference| probe log-prob accepted after a swap on an "
        "fp32 backend; a bf16/fp16 backend is judged against 3x its own measured probe noise, "
        "never below this (trainer/swap/verification.py).",
    )
    weight_transfer: Literal["files", "nccl", "ipc"] = Field(
        default="files",
        description="How a new version's weights reach its backends. files (the default): "
        "safetensors read by the worker extension. nccl / ipc: EXPERIMENTAL, never run against "
        "a real GPU vLLM server: vLLM's native weight-transfer engine streams full weights "
        "(in the served dtype) to each backend that runs on CUDA and was started with "
        '--weight-transfer-config \'{"backend": "nccl"}\' (or ipc), from a trainer with '
        "CUDA; every other backend gets the files, with the reason in the swap report.",
    )
    weight_transfer_host: str | None = Field(
        default=None,
        description="This trainer's address that the backends' workers connect to for the "
        "NCCL rendezvous (a TCPStore on a free port). Default: 127.0.0.1, so only backends on "
        "this host can take the NCCL transfer.",
    )
    backend_hold_s: float = Field(
        default=30.0,
        gt=0,
        description="How long a request waits at the gateway when no backend of its model is in "
        "routing (a swap, or a colocated trainer's update) before it fails with 503. Raise it "
        "above the longest colocated update, so that no request fails during one.",
    )
    backend_refresh_s: float = Field(
        default=5.0, gt=0, description="How often each gateway re-reads the backend registry."
    )
    backend_health_interval_s: float = Field(
        default=5.0,
        gt=0,
        description="How often each gateway probes every backend's /health (2 s timeout). A "
        "backend that fails is out of this gateway's routing until a probe succeeds; the "
        "registry state in Postgres is not changed (docs/architecture.md#backend-health).",
    )

    version_files_bind: str | None = Field(
        default=None,
        description="host:port where the trainer serves its version files over HTTP to backends "
        "that cannot read its disk (GET /versions/<model>/<version>/<kind>, bearer token, "
        "Range). Empty: no server; every backend reads the files from the path "
        "(docs/deployment.md#weights-over-http).",
    )
    version_files_url: str | None = Field(
        default=None,
        description="Base URL backends use to reach the version-file server (e.g. "
        "http://trainer-host:8200). Default: http://<version_files_bind>.",
    )
    version_files_token: str | None = Field(
        default=None,
        description="Bearer token of the version-file server: it reads version files and "
        "nothing else. Empty: a random one generated once and kept in <home>/version-files.token "
        "(mode 0600). Never the admin key (refused).",
    )

    training_consent: Literal["all", "none"] = Field(
        default="all",
        description="What a tenant without a training policy (PUT /admin/tenants/{t}/training-"
        "policy) consents to: all: its sessions may train every model; none: they are recorded "
        "and served but never trained on. Sessions created with auth off (no tenant) follow it "
        "too. The trainer applies it: set the same value where the trainer runs.",
    )
    retention_text_days: float | None = Field(
        default=None,
        ge=0,
        description="Drop the request and response bodies of completions older than this many "
        "days; token ids, log-probs, rewards and the ledger stay (training still works). Empty: "
        "keep texts forever.",
    )
    retention_records_days: float | None = Field(
        default=None,
        ge=0,
        description="Delete whole sessions (completions, rewards) created longer ago than this "
        "many days, except sessions claimed by an update in progress; the ledger keeps their "
        "tenant, tokens and versions. Empty: keep records forever.",
    )
    retention_sweep_s: float = Field(
        default=3600.0,
        ge=0,
        description="How often each gateway applies the retention settings (0: never; "
        "`rlgw retention sweep` runs it once).",
    )
    backend_platform: str = Field(
        default="",
        description="The platform `rlgw backend` launches vLLM for: cpu or gpu. Empty: gpu when "
        "torch sees a CUDA device, else cpu.",
    )
    claim_lease_s: float = Field(
        default=120.0,
        gt=0,
        description="Seconds a trainer's claim on sessions lasts unless renewed; its heartbeat "
        "renews it every quarter of this. A trainer that stops renewing (stopped, frozen, cut "
        "off) loses its claims once it passes, and another trainer takes the sessions.",
    )
    dist_timeout_s: float = Field(
        default=60.0,
        description="How long a collective of a multi-process trainer waits for a missing rank "
        "before it raises (seconds).",
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

    @field_validator("backend_allowlist")
    @classmethod
    def _parse_allowlist(cls, value: str) -> str:
        parse_allowlist(value)  # raises ValueError on a malformed entry
        return value

    @model_validator(mode="after")
    def _refuse_admin_key_as_file_token(self) -> Settings:
        if self.version_files_token and self.version_files_token == self.admin_key:
            raise ValueError(
                "RLGW_VERSION_FILES_TOKEN must not be the admin key: it is handed to every "
                "backend; use a token of its own (or leave it empty to generate one)"
            )
        return self

    @model_validator(mode="after")
    def _check_reward_range(self) -> Settings:
        if not self.reward_min < self.reward_max:
            raise ValueError(
                f"RLGW_REWARD_MIN ({self.reward_min}) must be below RLGW_REWARD_MAX "
                f"({self.reward_max})"
            )
        return self

    @model_validator(mode="after")
    def _refuse_unsafe_exposure(self) -> Settings:
        if is_loopback_host(self.host):
            return self
        if self.admin_key in ("", DEFAULT_ADMIN_KEY):
            raise ValueError(
                f"refusing to bind {self.host} with an empty or default admin key: "
                "set RLGW_ADMIN_KEY to a long random secret"
            )
        if self.auth == "off":
            raise ValueError(
                f"refusing to bind {self.host} with RLGW_AUTH=off: the open mode is for "
                "loopback binds only"
            )
        if self.token_secret == DEFAULT_TOKEN_SECRET or len(self.token_secret) < 32:
            raise ValueError(
                f"refusing to bind {self.host} with a default or short token secret: "
                "set RLGW_TOKEN_SECRET to a random secret of at least 32 characters (the same "
                "on every replica)"
            )
        return self

    @property
    def token_secret_unset(self) -> bool:
        """No usable token secret was configured (empty, or the public default): a process must
        sign with a random secret instead (allowed on loopback binds only, see above)."""
        return self.token_secret in ("", DEFAULT_TOKEN_SECRET)

    @property
    def base_url(self) -> str:
        return self.public_url or f"http://{self.host}:{self.port}"


@lru_cache
def get_settings() -> Settings:
    return Settings()
