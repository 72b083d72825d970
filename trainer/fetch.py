"""A backend's side of weights over HTTP: download a version file, resumably, and verify it.

Runs inside the vLLM worker (`rlgw_stage_url` in `trainer/vllm_worker.py`), outside the pause,
in a thread of its own (`BackgroundFetch`), so the server keeps serving while the file arrives.
The file lands in `<dir>/<sha256>.part` and is hashed as it arrives; a download cut off (a
dropped connection, a stage that timed out, a restarted worker) leaves the part, and the next
attempt asks only for the rest (`Range: bytes=<have>-`). Only a file whose sha256 is the one the
trainer recorded for the version is renamed to `<sha256>.safetensors` and handed to the loader;
a mismatch deletes the part and refuses, before any tensor is read. Workers of one server that
download the same file take turns on a lock, so the second finds it done.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

ATTEMPTS = 4  # connections per download: a cut one is resumed from where it stopped
CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 60.0
_BLOCK = 1 << 20


class FetchError(RuntimeError):
    """The file could not be downloaded, or it is not the file the trainer recorded."""


@dataclass(frozen=True)
class Fetched:
    path: Path
    bytes_downloaded: int  # over the network by this call
    resumed_from: int  # bytes already on disk from an earlier, cut-off download
    attempts: int  # connections opened (0: the verified file was already here)
    seconds: float


def download_dir() -> Path:
    """Where a backend keeps downloads: <its RLGW_HOME>/downloads (default ~/.rlgw)."""
    home = os.environ.get("RLGW_HOME") or str(Path.home() / ".rlgw")
    return Path(home) / "downloads"


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(_BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _forget_others(folder: Path, keep: str) -> None:
    """Earlier downloads (every file but this one's): their versions were staged or abandoned."""
    for other in folder.iterdir():
        if other.is_file() and not other.name.startswith(keep):
            with contextlib.suppress(OSError):
                other.unlink()


def fetch_verified(url: str, token: str, sha256: str, folder: Path | None = None) -> Fetched:
    """The verified local copy of the file at `url` whose sha256 must be `sha256`."""
    sha256 = sha256.lower()
    if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
        raise FetchError(f"not a sha256: {sha256!r}")
    folder = folder or download_dir()
    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    final, part = folder / f"{sha256}.safetensors", folder / f"{sha256}.part"
    with _locked(folder / f"{sha256}.lock"):
        _forget_others(folder, sha256)
        if final.is_file() and file_digest(final) == sha256:
            return Fetched(final, 0, 0, 0, time.perf_counter() - t0)
        # An earlier download cut off left a part: hash what it holds, ask for the rest.
        digest = _rehash(part)
        have = part.stat().st_size if part.is_file() else 0
        resumed_from, downloaded, attempts = have, 0, 0
        timeout = httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
        with httpx.Client(timeout=timeout, trust_env=False, follow_redirects=False) as http:
            while True:
                attempts += 1
                try:
                    have, got, digest = _one_attempt(http, url, token, part, have, digest)
                    downloaded += got
                    break
                except (httpx.TransportError, _Cut) as exc:
                    downloaded += exc.got if isinstance(exc, _Cut) else 0
                    have = part.stat().st_size if part.is_file() else 0
                    if attempts >= ATTEMPTS:
                        raise FetchError(
                            f"GET {url}: {exc} after {attempts} attempts "
                            f"({have:,} bytes kept for the next one)"
                        ) from exc
                    digest = _rehash(part)
        if digest.hexdigest() != sha256:
            part.unlink(missing_ok=True)
            raise FetchError(
                f"checksum mismatch for {url}: sha256 {digest.hexdigest()}, the version's "
                f"recorded checksum is {sha256}; the download was discarded, nothing was read"
            )
        part.replace(final)
    return Fetched(final, downloaded, resumed_from, attempts, time.perf_counter() - t0)


class _Cut(Exception):
    def __init__(self, cause: BaseException, got: int) -> None:
        super().__init__(str(cause))
        self.got = got


def _rehash(part: Path):
    digest = hashlib.sha256()
    if part.is_file():
        with part.open("rb") as f:
            for block in iter(lambda: f.read(_BLOCK), b""):
                digest.update(block)
    return digest


def _one_attempt(http: httpx.Client, url: str, token: str, part: Path, have: int, digest):
    """One GET from `have` on: (bytes on disk, bytes received, digest so far)."""
    headers = {"Authorization": f"Bearer {token}"}
    if have:
        headers["Range"] = f"bytes={have}-"
    with http.stream("GET", url, headers=headers) as reply:
        if reply.status_code == 416 and have:  # the part is already whole (or too long)
            return have, 0, digest
        if reply.status_code in (401, 403):
            raise FetchError(
                f"GET {url}: HTTP {reply.status_code}, the version-file token was refused"
            )
        if reply.status_code not in (200, 206):
            raise FetchError(f"GET {url}: HTTP {reply.status_code} {reply.read()[:200]!r}")
        if reply.status_code == 200 and have:  # the server ignored the range: start over
            have, digest = 0, hashlib.sha256()
        got = 0
        with part.open("r+b" if have else "wb") as f:
            f.seek(have)
            f.truncate()
            try:
                for block in reply.iter_bytes(_BLOCK):
                    f.write(block)
                    digest.update(block)
                    got += len(block)
            except httpx.TransportError as exc:
                f.flush()
                raise _Cut(exc, got) from exc
    return have + got, got, digest


class BackgroundFetch:
    """`fetch_verified` in a thread of the worker: the engine loop keeps serving while the file
    downloads, and the trainer polls (`rlgw_stage_url` answers "pending" until it is done)."""

    def __init__(self, url: str, token: str, sha256: str, reason: str) -> None:
        self.sha256 = sha256.lower()
        self.reason = reason  # why this backend downloads instead of reading the path
        self.part = download_dir() / f"{self.sha256}.part"
        self.result: Fetched | None = None
        self.error: Exception | None = None
        self._thread = threading.Thread(
            target=self._run, args=(url, token), name="rlgw-fetch", daemon=True
        )
        self._thread.start()

    def _run(self, url: str, token: str) -> None:
        try:
            self.result = fetch_verified(url, token, self.sha256)
        except Exception as exc:  # reported to the trainer by the next poll
            self.error = exc

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def received(self) -> int:
        """Bytes on disk so far (the trainer's measure of progress)."""
        try:
            return self.part.stat().st_size
        except OSError:
            return 0
