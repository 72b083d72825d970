"""Version files fetched over HTTP by a backend that cannot read the trainer's disk.

Only `stage` differs from the file updates: the worker (`rlgw_stage_url`) reads the file from
the trainer's path when it is on its host with the version's sha256, and otherwise downloads it
from the trainer's version-file server (`trainer/publishing/version_files.py`) with a bearer token
scoped to version files, resuming a cut-off download, and checks the sha256 before it reads a
tensor. The download runs in a thread of the worker while the trainer polls, so the server keeps
serving during it and no control call waits for the network. Apply, commit and rollback are the file
ones (the staged weights are in the worker's memory by then), so the network time is in the
stage, outside the pause.

A LoRA version (`RemoteLora`) likewise: its stage has the worker (`rlgw_fetch_adapter`) read
the trainer's adapter folder when both its files are on the backend's host with their sha256s,
and otherwise download both (the weights checked against the version's recorded checksum, the
config against the sha256 the publisher took when it offered the version) into a folder of the
backend's own, then loads that folder with `/v1/load_lora_adapter`. Everything after the load
is `LoraAdapter`'s. A downloaded folder is deleted once the server no longer lists its adapter
and a newer one has arrived (`rlgw_vllm/fetch.py`, `fetch_adapter`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.backends.vllm_control import ControlError, VllmControl

from .base import Staged
from .files import DeltaFile, FileUpdate, FullFile, wait_for_stage
from .lora import LoraAdapter

POLL_S = 0.25  # how often the trainer asks a downloading worker
STALL_S = 60.0  # a download that receives nothing for this long is refused (its part is kept)


def poll_download(backend: VllmControl, what: str, method: str, **kwargs: str) -> list[Any]:
    """The workers' answers to `method` once none is "pending" (downloading in its thread): asked
    every POLL_S; ControlError when the bytes received stop growing for STALL_S."""
    received, progressed = -1, time.monotonic()
    while True:
        answers = backend.rpc(method, **kwargs)
        reports = [r for r in answers if isinstance(r, dict)]
        if not any(r.get("pending") for r in reports):
            return answers
        now = sum(r.get("received", 0) for r in reports)
        if now > received:
            received, progressed = now, time.monotonic()
        elif time.monotonic() - progressed > STALL_S:
            raise ControlError(
                f"the download of {what} made no progress for {STALL_S:.0f} s "
                f"({received:,} bytes so far, kept on the backend for the next swap)"
            )
        time.sleep(POLL_S)


def delivery_note(reports: list[dict[str, Any]]) -> str:
    """`Staged.note`: how the first worker got the update, and why (its `delivery` fields)."""
    first = reports[0] if reports else {}
    return f"{first.get('delivery')} delivery: {first.get('delivery_reason')}"


@dataclass(frozen=True)
class VersionSource:
    """Where backends fetch version files: the server's base URL, and its token."""

    base_url: str
    token: str

    def __repr__(self) -> str:  # never print the token
        return f"VersionSource({self.base_url!r})"


class RemoteFile(FileUpdate):
    """A stored version file at `path` on the trainer, also served at `url` with `sha256`."""

    def __init__(
        self, path: str | Path, url: str, sha256: str, token: str, *, offer_path: bool = True
    ) -> None:
        super().__init__(path)
        self.url, self.sha256, self.token = url, sha256, token
        self.offer_path = offer_path  # False: always download (benchmarks)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r}, sha256={self.sha256[:12]}...)"

    def stage(self, backend: VllmControl) -> Staged:
        """Ask until the worker has the file and staged it: each call returns at once while the
        download runs in the worker's thread. Refused when the download stops making progress."""
        staged = poll_download(
            backend,
            self.url,
            "rlgw_stage_url",
            url=self.url,
            sha256=self.sha256,
            kind=self.kind,
            token=self.token,
            path=self.path if self.offer_path else "",
        )
        staged = wait_for_stage(backend, staged)  # the download is in: its stage runs in a thread
        reports = [r for r in staged if isinstance(r, dict)]
        nbytes = sum(
            r.get("downloaded", 0) if r.get("delivery") == "http" else r.get("bytes", 0)
            for r in reports
        )
        return Staged(nbytes, staged, note=delivery_note(reports))


class RemoteDelta(RemoteFile, DeltaFile):
    """A delta file, fetched over HTTP where its path is not readable."""


class RemoteFull(RemoteFile, FullFile):
    """Full weights (a full version or an anchor), fetched over HTTP where needed."""


REMOTE_KINDS: dict[str, type[RemoteFile]] = {cls.kind: cls for cls in (RemoteDelta, RemoteFull)}


def remote(update: FileUpdate, url: str, sha256: str, token: str) -> RemoteFile:
    """`update`, also offered at `url` for backends that cannot read its path."""
    return REMOTE_KINDS[update.kind](update.path, url, sha256, token)


@dataclass(frozen=True)
class ServedFile:
    """One file of a version on the version-file server: its URL and the sha256 it must have."""

    url: str
    sha256: str


class RemoteLora(LoraAdapter):
    """A stored LoRA version whose two files are also served over HTTP: `config` and `weights`
    (the weights' sha256 is the version's recorded checksum)."""

    def __init__(
        self,
        path: str | Path,
        model_name: str,
        version: int,
        *,
        config: ServedFile,
        weights: ServedFile,
        token: str,
        offer_path: bool = True,
    ) -> None:
        super().__init__(path, model_name, version)
        self.config, self.weights, self.token = config, weights, token
        self.offer_path = offer_path  # False: always download (tests, benchmarks)

    def __repr__(self) -> str:  # never the token
        return f"RemoteLora({self.weights.url!r}, sha256={self.weights.sha256[:12]}...)"

    def stage(self, backend: VllmControl) -> Staged:
        """The trainer's folder checked (as `LoraAdapter.stage` does), then the adapter on the
        backend's host, read from the trainer's path or downloaded and verified there (each
        call returns at once while the download runs in a worker's thread), then loaded from
        that folder beside the served adapter. A refusal at any step leaves the backend as it
        was: nothing is loaded before both files are verified."""
        problems = self.problems()
        if problems:
            raise ControlError(f"adapter {self.name} refused: {'; '.join(problems)}")
        answers = poll_download(
            backend,
            self.weights.url,
            "rlgw_fetch_adapter",
            config_url=self.config.url,
            config_sha256=self.config.sha256,
            weights_url=self.weights.url,
            weights_sha256=self.weights.sha256,
            token=self.token,
            path=self.path if self.offer_path else "",
            keep="\n".join(loaded_folders(backend)),
        )
        reports = [r for r in answers if isinstance(r, dict) and r.get("folder")]
        if not reports:
            raise ControlError(f"rlgw_fetch_adapter: no worker answered a folder ({answers!r})")
        folder = reports[0]["folder"]  # the workers of one server share its host and its folder
        loaded = backend.load_lora_adapter(self.name, folder)  # served by nobody yet
        http = reports[0].get("delivery") == "http"
        nbytes = sum(r.get("downloaded", 0) for r in reports) if http else self.nbytes
        detail = {"adapter": self.name, "path": folder, "vllm": loaded, "workers": answers}
        return Staged(nbytes, detail, note=delivery_note(reports))


def loaded_folders(backend: VllmControl) -> list[str]:
    """The folders of the adapters the backend has loaded, as vLLM lists them (`root`): the
    downloaded ones it may read again, which the worker keeps."""
    reply = backend.http.get(backend.url + "/v1/models")
    reply.raise_for_status()
    models = [m for m in reply.json().get("data", []) if isinstance(m, dict)]
    return [str(m["root"]) for m in models if m.get("parent") and m.get("root")]
