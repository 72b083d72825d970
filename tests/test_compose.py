"""docker-compose.yml validates and describes the deployment we intend (config only: no engine).

`docker-compose config` (1.29, Debian's package) and, where the plugin exists, `docker compose
config` (v2) parse, interpolate and validate the file without a Docker engine. Nothing here
builds an image or starts a container.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlgw.backend_launcher import check_sampling_args

ROOT = Path(__file__).resolve().parent.parent
COMPOSE_FILE = ROOT / "docker-compose.yml"
SERVICES = {"postgres", "vllm", "gateway", "trainer"}
ADMIN_KEY = "compose-test-admin-key-0123456789"
TOKEN_SECRET = "compose-test-token-secret-0123456789"
NOT_INSTALLED = "docker-compose not installed: apt-get install docker-compose"
TOOLS = {"docker-compose": ["docker-compose"], "docker compose": ["docker", "compose"]}


@cache
def _available(tool: str) -> bool:
    argv = TOOLS[tool]
    if shutil.which(argv[0]) is None:
        return False
    try:
        probe = subprocess.run(
            [*argv, "version"], capture_output=True, text=True, timeout=20, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


@pytest.fixture(params=list(TOOLS), ids=lambda t: t.replace(" ", "-"))
def compose(request: pytest.FixtureRequest) -> list[str]:
    tool = request.param
    if not _available(tool):
        if not any(_available(t) for t in TOOLS):
            pytest.skip(NOT_INSTALLED)
        pytest.skip(f"`{tool}` not installed here (the other compose tool is tested)")
    return TOOLS[tool]


def _run_config(
    compose: list[str],
    tmp_path: Path,
    admin_key: str | None,
    token_secret: str | None = TOKEN_SECRET,
):
    """`<compose> config` on our file with a clean environment and an empty env file."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("RLGW_", "POSTGRES_", "COMPOSE_"))
    }
    if admin_key is not None:
        env["RLGW_ADMIN_KEY"] = admin_key
    if token_secret is not None:
        env["RLGW_TOKEN_SECRET"] = token_secret
    env_file = tmp_path / "empty.env"  # ignore a developer's ./.env
    env_file.write_text("")
    argv = [
        *compose,
        "--env-file",
        str(env_file),
        "-f",
        str(COMPOSE_FILE),
        "config",
    ]
    return subprocess.run(
        argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False
    )


@pytest.fixture
def config(compose: list[str], tmp_path: Path) -> dict[str, Any]:
    result = _run_config(compose, tmp_path, ADMIN_KEY)
    assert result.returncode == 0, f"{' '.join(compose)} config failed:\n{result.stderr}"
    parsed = yaml.safe_load(result.stdout)
    assert isinstance(parsed, dict) and "services" in parsed, result.stdout
    return parsed


def _argv(value: Any) -> list[str]:
    """command/entrypoint as a list (a string form is split on whitespace)."""
    if value is None:
        return []
    return value.split() if isinstance(value, str) else [str(v) for v in value]


def _env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}


def _published_ports(service: dict[str, Any]) -> set[int]:
    ports = set()
    for port in service.get("ports") or []:
        if isinstance(port, dict):
            if port.get("published") not in (None, ""):
                ports.add(int(port["published"]))
        else:  # short syntax: [HOST_IP:]HOST:CONTAINER[/proto] or CONTAINER
            parts = str(port).split("/")[0].split(":")
            if len(parts) >= 2:
                ports.add(int(parts[-2]))
    return ports


def _condition(service: dict[str, Any], dependency: str) -> str | None:
    depends = service.get("depends_on") or {}
    if isinstance(depends, list):
        return "service_started" if dependency in depends else None
    entry = depends.get(dependency)
    return None if entry is None else (entry or {}).get("condition", "service_started")


def test_services_and_healthchecks(config: dict[str, Any]) -> None:
    services = config["services"]
    assert set(services) >= SERVICES, sorted(services)
    for name in ("postgres", "vllm", "gateway"):
        check = services[name].get("healthcheck") or {}
        assert check.get("test") and not check.get("disable"), f"{name} has no healthcheck"
    assert "pg_isready" in " ".join(_argv(services["postgres"]["healthcheck"]["test"]))
    assert "/health" in " ".join(_argv(services["vllm"]["healthcheck"]["test"]))
    assert "/healthz" in " ".join(_argv(services["gateway"]["healthcheck"]["test"]))


def test_vllm_dev_mode_and_worker_extension(config: dict[str, Any]) -> None:
    vllm = config["services"]["vllm"]
    assert _env(vllm).get("VLLM_SERVER_DEV_MODE") == "1"
    argv = _argv(vllm.get("command"))
    assert "--worker-extension-cls" in argv, argv
    assert argv[argv.index("--worker-extension-cls") + 1] == (
        "rlgw_vllm.extension.WeightUpdateExtension"
    )
    assert argv[argv.index("--served-model-name") + 1] == "policy"
    assert argv[argv.index("--dtype") + 1] == "bfloat16"
    devices = vllm["deploy"]["resources"]["reservations"]["devices"]
    assert any(d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", []) for d in devices)


def test_vllm_reports_processed_logprobs_with_its_own_sampling_defaults(config: dict) -> None:
    """Like `rlgw backend`: the recorded log-probs are those of the distribution sampled from,
    and no model default the gateway cannot see is applied (docs/training.md)."""
    argv = _argv(config["services"]["vllm"].get("command"))
    assert argv[argv.index("--logprobs-mode") + 1] == "processed_logprobs"
    assert argv[argv.index("--generation-config") + 1] == "vllm"
    check_sampling_args(argv)  # nothing there the launcher would refuse


def test_database_port_not_published(config: dict[str, Any]) -> None:
    services = config["services"]
    assert not services["postgres"].get("ports"), "postgres must stay on the compose network"
    for name, service in services.items():
        assert 5432 not in _published_ports(service), f"{name} publishes the database port"
    assert _published_ports(services["gateway"]), "the gateway must be published"
    assert _env(services["gateway"])["RLGW_ADMIN_KEY"] == ADMIN_KEY
    assert _env(services["gateway"])["RLGW_DATABASE_URL"].startswith("postgresql://")


def test_startup_order(config: dict[str, Any]) -> None:
    services = config["services"]
    assert _condition(services["gateway"], "postgres") == "service_healthy"
    assert _condition(services["register"], "gateway") == "service_healthy"
    assert _condition(services["register"], "vllm") == "service_healthy"
    register_argv = _argv(services["register"].get("command"))
    assert register_argv[:2] == ["rlgw", "register"], register_argv
    assert "http://vllm:8000" in register_argv
    trainer = services["trainer"]
    assert _condition(trainer, "register") == "service_completed_successfully"
    assert _argv(trainer.get("entrypoint")) + _argv(trainer.get("command")) == [
        "rlgw",
        "train",
        "--model",
        "policy",
        "--device",
        "cuda",
        "--dtype",
        "bfloat16",
    ]


def test_admin_key_required(compose: list[str], tmp_path: Path) -> None:
    result = _run_config(compose, tmp_path, admin_key=None)
    assert result.returncode != 0, "config must fail without RLGW_ADMIN_KEY"
    assert "RLGW_ADMIN_KEY" in result.stdout + result.stderr


def test_token_secret_required(compose: list[str], tmp_path: Path) -> None:
    result = _run_config(compose, tmp_path, ADMIN_KEY, token_secret=None)
    assert result.returncode != 0, "config must fail without RLGW_TOKEN_SECRET"
    assert "RLGW_TOKEN_SECRET" in result.stdout + result.stderr


def test_gateway_runs_with_auth_and_an_allowlisted_backend(config: dict[str, Any]) -> None:
    gateway = _env(config["services"]["gateway"])
    assert gateway["RLGW_TOKEN_SECRET"] == TOKEN_SECRET
    assert "RLGW_AUTH" not in gateway or gateway["RLGW_AUTH"] == "on"
    register = _env(config["services"]["register"])
    assert register["RLGW_BACKEND_ALLOWLIST"] == "vllm"


def _mounts(service: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    """target path -> (source, read-only) for each volume of a service."""
    mounts = {}
    for volume in service.get("volumes") or []:
        if isinstance(volume, dict):
            mounts[volume["target"]] = (str(volume.get("source")), bool(volume.get("read_only")))
        else:
            source, target, *mode = str(volume).split(":")
            mounts[target] = (source, bool(mode) and mode[0] == "ro")
    return mounts


def test_the_trainer_and_vllm_agree_on_where_versions_live(config: dict[str, Any]) -> None:
    """The trainer writes version files under its RLGW_HOME (trainer/publishing/versions.py) and the
    backend reads them at the path it is told: both must mount one volume at that directory."""
    from rlgw.settings import Settings
    from trainer.publishing.versions import version_file

    services = config["services"]
    trainer, vllm = services["trainer"], services["vllm"]
    home = Settings(home=_env(trainer)["RLGW_HOME"]).home
    versions_dir = str(version_file(home, "policy", 1, "delta").parent.parent)
    writes, reads = _mounts(trainer), _mounts(vllm)
    assert versions_dir in writes and not writes[versions_dir][1], writes
    assert versions_dir in reads and reads[versions_dir][0] == writes[versions_dir][0], reads
    register = _argv(services["register"].get("command"))
    base = register[register.index("--path") + 1]
    assert reads[base][0] == writes[base][0], "the base model must be the same in both"
    assert _argv(vllm.get("command"))[0] == base  # what vLLM serves is what training starts from


def test_the_trainer_trains_on_the_gpu_it_reserves_in_bf16(config: dict[str, Any]) -> None:
    from rlgw_cli import build_parser
    from trainer.config import DEVICES, DTYPES

    trainer, vllm = config["services"]["trainer"], config["services"]["vllm"]
    argv = _argv(trainer.get("entrypoint")) + _argv(trainer.get("command"))
    assert argv[0] == "rlgw"
    args = build_parser().parse_args(argv[1:])  # the project's own parser: the flags exist
    assert args.model == "policy" and args.device == "cuda" and args.dtype == "bfloat16"
    assert args.device in DEVICES and args.dtype in DTYPES  # values TrainerConfig accepts
    devices = trainer["deploy"]["resources"]["reservations"]["devices"]
    assert any(d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", []) for d in devices)
    served = _argv(vllm.get("command"))
    assert served[served.index("--dtype") + 1] == "bfloat16"
    share = float(served[served.index("--gpu-memory-utilization") + 1])
    assert share <= 0.5  # the trainer shares the one GPU
