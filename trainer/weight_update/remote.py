"""Version files fetched over HTTP by a backend that cannot read the trainer's disk.

Only `stage` differs from the file updates: the worker (`rlgw_stage_url`) reads the file from
the trainer's path when it is on its host with the version's sha256, and otherwise downloads it
from the trainer's version-file server (`trainer/version_files.py`) with a bearer token scoped
to version files, resuming a cut-off download, and checks the sha256 before it reads a tensor.
Apply, commit and rollback are the file ones (the staged weights are in the worker's memory by
then), so the network time is in the stage, outside the pause.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trainer.vllm_control import VllmControl

from .base import Staged
from .files import DeltaFile, FileUpdate, FullFile


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
        staged = backend.rpc(
            "rlgw_stage_url",
            url=self.url,
            sha256=self.sha256,
            kind=self.kind,
            token=self.token,
            path=self.path if self.offer_path else "",
        )
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
