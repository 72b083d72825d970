"""Whether a backend can take vLLM's native weight transfer, and why not when it cannot.

The trainer learns it from the backend itself, not from the registry: `GET /server_info
?config_format=json` (vLLM's dev-mode route, `vllm/entrypoints/serve/dev/server_info/
api_router.py`; rlgw backends run in dev mode already) returns the server's `VllmConfig`, whose
`weight_transfer_config` is what `--weight-transfer-config` set (null without it) and whose
`device_config.device` says where the model runs; `GET /get_world_size` (the RL router,
`vllm/entrypoints/rl/online/api_router.py`) gives how many workers join the transfer group.
Measured on the CPU build: a server started with `--weight-transfer-config '{"backend":
"nccl"}'` reports `{"backend": "nccl"}` there and `device: cpu`; one started without reports null.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

import torch

from trainer.backends.vllm_control import VllmControl

METHODS = ("nccl", "ipc")


@dataclass(frozen=True)
class ServerInfo:
    """What a backend says about itself that decides the transfer."""

    device: str  # "cuda", "cpu", ...
    weight_transfer: str | None  # the --weight-transfer-config backend, None without the flag
    dtype: torch.dtype  # what the served weights are in: the wire dtype
    world_size: int  # inference workers (TP x PP x DP) that receive the weights
    insecure_serialization: bool  # VLLM_ALLOW_INSECURE_SERIALIZATION: IPC handles over HTTP

    @classmethod
    def parse(cls, server_info: dict, world_size: int) -> ServerInfo:
        """From the JSON of /server_info?config_format=json and /get_world_size."""
        config = server_info.get("vllm_config") or {}
        transfer = config.get("weight_transfer_config") or None
        return cls(
            device=str((config.get("device_config") or {}).get("device", "unknown")),
            weight_transfer=str(transfer.get("backend")) if isinstance(transfer, dict) else None,
            dtype=_dtype((config.get("model_config") or {}).get("dtype")),
            world_size=int(world_size),
            insecure_serialization=bool(
                (server_info.get("vllm_env") or {}).get("VLLM_ALLOW_INSECURE_SERIALIZATION")
            ),
        )


def _dtype(value: object) -> torch.dtype:
    """'torch.bfloat16' or 'bfloat16' (how pydantic dumps a torch.dtype) -> torch.bfloat16."""
    name = str(value).removeprefix("torch.")
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"the server reports a model dtype {value!r} that torch does not know")
    return dtype


def probe(backend: VllmControl) -> ServerInfo:
    """Ask the backend (two GETs; raises httpx.HTTPError, or ValueError on an odd answer)."""
    reply = backend.http.get(backend.url + "/server_info", params={"config_format": "json"})
    reply.raise_for_status()
    sizes = backend.http.get(backend.url + "/get_world_size")
    sizes.raise_for_status()
    return ServerInfo.parse(reply.json(), sizes.json()["world_size"])


def is_loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def sending_device() -> torch.device:
    """The GPU the trainer sends from (its current CUDA device), or the CPU when it has none."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def trainer_problems(device: torch.device) -> list[str]:
    """What the trainer's side lacks: a CUDA device to send from, vLLM's trainer engines."""
    problems = []
    if device.type != "cuda" or not torch.cuda.is_available():
        problems.append("the trainer has no CUDA device")
    try:
        import vllm.distributed.weight_transfer  # noqa: F401 - the trainer-side engines
    except ImportError as exc:
        problems.append(f"vLLM's trainer-side engines cannot be imported here ({exc})")
    return problems


def server_problems(
    method: str, server: ServerInfo, url: str, transfer_host: str | None
) -> list[str]:
    """What the backend lacks for `method` ("nccl" or "ipc")."""
    problems = []
    if server.device != "cuda":
        problems.append(f"the backend runs on {server.device}, not CUDA")
    if server.weight_transfer is None:
        problems.append(
            f'the backend was started without --weight-transfer-config \'{{"backend": '
            f'"{method}"}}\''
        )
    elif server.weight_transfer != method:
        problems.append(
            f"the backend's weight transfer is {server.weight_transfer!r}, not {method!r}"
        )
    if method == "nccl" and transfer_host is None and not is_loopback(url):
        problems.append(
            "the backend is on another host: set RLGW_WEIGHT_TRANSFER_HOST to an address of "
            "this trainer that the backend's workers can reach"
        )
    if method == "ipc":
        if not is_loopback(url):
            problems.append("CUDA IPC needs the backend on the trainer's host (and GPU)")
        if not server.insecure_serialization:
            problems.append(
                "CUDA IPC handles travel pickled over HTTP: the backend needs "
                "VLLM_ALLOW_INSECURE_SERIALIZATION=1"
            )
    return problems
