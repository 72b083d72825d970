"""The trainer's weight-transfer groups with its backends: one per backend, opened once, reused.

A link is vLLM's trainer engine for one backend (its NCCL group: the trainer at rank 0, the
backend's workers after it; or its IPC channel), the source it replays and the control client
it drives. It is opened at the backend's first stage (the rendezvous is outside the pause) and
kept for the trainer's life; a failed round tears it down (vLLM: after a failed broadcast "the
transfer group is unusable"), and the next stage opens a new one. Every call into vLLM runs in
a daemon thread bounded by the swap's control timeout: an NCCL collective whose peer is gone
never returns, and the swap must not hang with it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
import torch

from trainer.backends.vllm_control import ControlError, VllmControl

from .base import WeightsUnknown
from .native_probe import ServerInfo, probe, server_problems, trainer_problems
from .sync_client import ControlSyncClient

T = TypeVar("T")
# (method, rendezvous host, workers, client, source) -> a ready vLLM TrainerWeightTransferEngine
OpenEngine = Callable[[str, str, int, ControlSyncClient, Any], Any]


@dataclass
class Link:
    engine: Any  # vllm.distributed.weight_transfer.TrainerWeightTransferEngine
    source: Any  # its RoundSource: the tensors of the round
    client: ControlSyncClient
    server: ServerInfo


class TransferLinks:
    """Open links by backend URL, for one method ("nccl" or "ipc")."""

    def __init__(
        self,
        method: str,
        *,
        device: torch.device,
        host: str | None = None,
        timeout_s: float = 120.0,
        open_engine: OpenEngine | None = None,
    ) -> None:
        self.method = method
        self.device = device  # where the trainer's weights are: the sending GPU
        self.host = host  # the trainer's address for the backends' workers (NCCL rendezvous)
        self.timeout_s = timeout_s
        self._open_engine = open_engine
        self._servers: dict[str, ServerInfo] = {}
        self._links: dict[str, Link] = {}

    # ------------------------------------------------------------------ selection
    def server(self, backend: VllmControl) -> ServerInfo:
        """What the backend says about itself: asked again until a link to it is open (a
        backend restarted with other flags is judged as it is now), then kept with the link."""
        if backend.url not in self._links or backend.url not in self._servers:
            self._servers[backend.url] = probe(backend)
        return self._servers[backend.url]

    def problems(self, backend: VllmControl) -> list[str]:
        """Why this method cannot update `backend`; empty when it can."""
        problems = trainer_problems(self.device)
        try:
            server = self.server(backend)
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            return [*problems, f"the backend did not say how it runs (GET /server_info: {exc})"]
        return problems + server_problems(self.method, server, backend.url, self.host)

    # ------------------------------------------------------------------ rounds
    def link(self, backend: VllmControl) -> Link:
        """The open link to `backend`, after a rendezvous if there is none (ControlError if it
        fails: the backend's weights were not touched)."""
        if backend.url in self._links:
            return self._links[backend.url]
        server = self.server(backend)
        client = ControlSyncClient(backend)
        from .vllm_engines import RoundSource, open_engine  # vLLM, imported only from here

        open_engine = self._open_engine or open_engine
        source = RoundSource()
        host = self.host or "127.0.0.1"
        try:
            engine = self._bounded(
                lambda: open_engine(self.method, host, server.world_size, client, source),
                f"{self.method} rendezvous",
            )
        except Exception as exc:  # noqa: BLE001 - vLLM raises what its transport raises
            self._servers.pop(backend.url, None)
            raise ControlError(
                f"{self.method} rendezvous with {backend.url} failed: {exc}"
            ) from exc
        self._links[backend.url] = link = Link(engine, source, client, server)
        return link

    def send(self, link: Link, tensors: dict[str, torch.Tensor]) -> None:
        """One round: the backend's weights become `tensors`. ControlError when the backend
        refused before the round started (its weights untouched); WeightsUnknown after."""
        link.source.tensors = tensors
        link.client.phase = None
        try:
            self._bounded(link.engine.send_weights, f"{self.method} transfer")
        except Exception as exc:  # noqa: BLE001 - HTTP, NCCL or a timeout: the round failed
            phase = link.client.phase
            self.drop(link.client.backend.url)
            if phase is None:
                raise ControlError(f"/start_weight_update refused: {exc}") from exc
            raise WeightsUnknown(
                f"{self.method} transfer failed after /{phase}_weight_update: {exc}"
            ) from exc
        finally:
            link.source.tensors = {}  # the GPU copy is the update's to keep or free, not the link's

    def drop(self, url: str) -> None:
        """Forget the link to `url` (its group is unusable after a failed round)."""
        self._servers.pop(url, None)
        link = self._links.pop(url, None)
        if link is not None:
            with contextlib.suppress(Exception):  # best effort: the peer may be gone
                self._bounded(link.engine.shutdown, f"{self.method} shutdown")

    def close(self) -> None:
        for url in list(self._links):
            self.drop(url)

    def _bounded(self, fn: Callable[[], T], what: str) -> T:
        """fn() in a daemon thread on the trainer's device; TimeoutError after timeout_s (the
        thread is left behind: a collective without its peer cannot be cancelled)."""
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                if self.device.type == "cuda":
                    torch.cuda.set_device(self.device)  # the current device is per thread
                outcome["value"] = fn()
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
                outcome["error"] = exc

        thread = threading.Thread(target=run, name=f"rlgw-{what}", daemon=True)
        thread.start()
        thread.join(self.timeout_s)
        if thread.is_alive():
            raise TimeoutError(f"{what} took longer than {self.timeout_s:g} s")
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]
