"""Version files fetched over HTTP by a backend that cannot read the trainer's disk.

Only `stage` differs from the file updates: the worker (`rlgw_stage_url`) reads the file from
the trainer's path when it is on its host with the version's sha256, and otherwise downloads it
from the trainer's version-file server (`trainer/version_files.py`) with a bearer token scoped
to version files, resuming a cut-off download, and checks the sha256 before it reads a tensor.
The download runs in a thread of the worker while the trainer polls, so the server keeps serving
during it and no control call waits for the network. Apply, commit and rollback are the file
ones (the staged weights are in the worker's memory by then), so the network time is in the
stage, outside the pause.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from trainer.vllm_control import ControlError, VllmControl

from .base import Staged
from .files import DeltaFile, FileUpdate, FullFile, wait_for_stage

POLL_S = 0.25  # how often the trainer asks a downloading worker
STALL_S = 60.0  # a download that receives nothing for this long is refused (its part is kept)


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
        received, progressed = -1, time.monotonic()
        while True:
            staged = backend.rpc(
                "rlgw_stage_url",
                url=self.url,
                sha256=self.sha256,
                kind=self.kind,
                token=self.token,
                path=self.path if self.offer_path else "",
            )
            reports = [r for r in staged if isinstance(r, dict)]
            if not any(r.get("pending") for r in reports):
                break
            now = sum(r.get("received", 0) for r in reports)
            if now > received:
                received, progressed = now, time.monotonic()
            elif time.monotonic() - progressed > STALL_S:
                raise ControlError(
                    f"the download of {self.url} made no progress for {STALL_S:.0f} s "
                    f"({received:,} bytes so far, kept on the backend for the next swap)"
                )
            time.sleep(POLL_S)
        staged = wait_for_stage(backend, staged)  # the download is in: its stage runs in a thread
        reports = [r for r in staged if isinstance(r, dict)]
        nbytes = sum(
            r.get("downloaded", 0) if r.get("delivery") == "http" else r.get("bytes", 0)
            for r in reports
        )
        first = reports[0] if reports else {}
        note = f"{first.get('delivery')} delivery: {first.get('delivery_reason')}"
        return Staged(nbytes, staged, note=note)


class RemoteDelta(RemoteFile, DeltaFile):
    """A delta file, fetched over HTTP where its path is not readable."""


class RemoteFull(RemoteFile, FullFile):
    """Full weights (a full version or an anchor), fetched over HTTP where needed."""


REMOTE_KINDS: dict[str, type[RemoteFile]] = {cls.kind: cls for cls in (RemoteDelta, RemoteFull)}


def remote(update: FileUpdate, url: str, sha256: str, token: str) -> RemoteFile:
    """`update`, also offered at `url` for backends that cannot read its path."""
    return REMOTE_KINDS[update.kind](update.path, url, sha256, token)
