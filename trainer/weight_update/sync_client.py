"""vLLM's weight-sync control plane over the project's control client, one phase at a time.

vLLM's trainer engines drive the inference side through any object with the methods of its
structural protocol `vllm.distributed.weight_transfer.base.VLLMWeightSyncClient`. vLLM ships
`HTTPVLLMWeightSyncClient` (`clients.py`, on `requests`); this one speaks the same routes with
the same bodies (`vllm/entrypoints/rl/online/api_router.py`: `init_info`, `update_info` and
`weight_version` are embedded body fields) through `VllmControl`, so a refusal is a
`ControlError` with the server's message, the swap's HTTP client and timeouts apply, and the
last phase that answered is kept: whether a failed round had already started matters (after
`/start_weight_update` the worker has moved its layers to the meta device until
`/finish_weight_update`, so the served weights are gone, not just stale).
"""

from __future__ import annotations

import base64
import pickle
from typing import Any

from trainer.backends.vllm_control import VllmControl

PHASES = ("init", "start", "update", "finish", "shutdown")


class ControlSyncClient:
    """`VLLMWeightSyncClient` for one backend."""

    def __init__(self, backend: VllmControl) -> None:
        self.backend = backend
        self.phase: str | None = None  # the last call that answered 200

    def _call(self, phase: str, path: str, body: dict[str, Any] | None = None) -> None:
        self.backend.post_json(path, body)
        self.phase = phase

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self._call("init", "/init_weight_transfer_engine", {"init_info": init_info})

    def shutdown_weight_transfer_engine(self) -> None:
        self._call("shutdown", "/shutdown_weight_transfer_engine")

    def start_weight_update(self) -> None:
        self._call("start", "/start_weight_update")

    def update_weights(self, update_info: dict[str, Any] | list[dict[str, Any]]) -> None:
        infos = update_info if isinstance(update_info, list) else [update_info]
        safe = [_json_safe(info) for info in infos]
        self._call(
            "update",
            "/update_weights",
            {"update_info": safe if isinstance(update_info, list) else safe[0]},
        )

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        # The swap labels the version only after parity: never here (weight_version stays None).
        body = {"weight_version": weight_version} if weight_version is not None else None
        self._call("finish", "/finish_weight_update", body)


def _json_safe(info: dict[str, Any]) -> dict[str, Any]:
    """CUDA IPC handles are not JSON: vLLM's worker accepts them pickled and base64-encoded as
    `ipc_handles_pickled` (`IPCWeightTransferUpdateInfo`, only with
    VLLM_ALLOW_INSECURE_SERIALIZATION=1 on the server). NCCL metadata passes unchanged."""
    if info.get("ipc_handles") is None:
        return info
    out = {k: v for k, v in info.items() if k != "ipc_handles"}
    out["ipc_handles_pickled"] = base64.b64encode(pickle.dumps(info["ipc_handles"])).decode()
    return out
