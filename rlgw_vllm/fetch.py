"""A backend's side of weights over HTTP: download a version file, resumably, and verify it.

Runs inside the vLLM worker (`rlgw_stage_url` in `rlgw_vllm/delivery.py`), outside the pause,
in a thread of its own (`BackgroundFetch`), so the server keeps serving while the file arrives.
The file lands in `<dir>/<sha256>.part` and is hashed as it arrives; a download cut off (a
dropped connection, a stage that timed out, a restarted worker) leaves the part, and the next
attempt asks only for the rest (`Range: bytes=<have>-`). Only a file whose sha256 is the one the
trainer recorded for the version is renamed to `<sha256>.safetensors` and handed to the loader;
a mismatch deletes the part and refuses, before any tensor is read. Workers of one server that
download the same file take turns on a lock, so the second finds it done.

A LoRA adapter (`fetch_adapter`, `rlgw_fetch_adapter`) is a folder of two files, each fetched
and checked the same way, then moved under peft's names into `<dir>/adapters/<weights sha256>/`,
the folder handed to `/v1/load_lora_adapter`. vLLM may read that folder again while the adapter
stays loaded (it reloads an adapter evicted from its cache), so a downloaded adapter is kept
while the server lists it: once a new one is in, every other downloaded adapter folder is
deleted but those the trainer says the server has loaded (`keep`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import re
import shutil
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from .cpu_priority import yield_cpu_to_serving
from .settings import WorkerSettings

ATTEMPTS = 4  # connections per download: a cut one is resumed from where it stopped
CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 60.0
_BLOCK = 1 << 20
# peft's file names in an adapter folder (trainer/weight_update/lora.py has the same: this module
# runs inside the vLLM worker, which imports nothing of the trainer's update classes)
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
_SHA256 = re.compile(r"[0-9a-f]{64}")


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
    return WorkerSettings().home / "downloads"


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


def _checked_sha256(sha256: str) -> str:
    """`sha256` in lower case; FetchError unless it is one (it also names files and folders)."""
    sha256 = sha256.lower()
    if not _SHA256.fullmatch(sha256):
        raise FetchError(f"not a sha256: {sha256!r}")
    return sha256


def fetch_verified(url: str, token: str, sha256: str, folder: Path | None = None) -> Fetched:
    """The verified local copy of the file at `url` whose sha256 must be `sha256`."""
    sha256 = _checked_sha256(sha256)
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
        yield_cpu_to_serving()  # the download and its checksum must not slow the forward passes
        try:
            self.result = self._fetch(url, token)
        except Exception as exc:  # reported to the trainer by the next poll
            self.error = exc

    def _fetch(self, url: str, token: str) -> Fetched:
        return fetch_verified(url, token, self.sha256)

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def received(self) -> int:
        """Bytes on disk so far (the trainer's measure of progress)."""
        try:
            return self.part.stat().st_size
        except OSError:
            return 0


# ---------------------------------------------------------------------- LoRA adapter folders


def adapters_dir() -> Path:
    """Where a backend keeps downloaded adapters: <downloads>/adapters/<weights sha256>/."""
    return download_dir() / "adapters"


def adapter_mismatch(folder: Path, config_sha256: str, weights_sha256: str) -> str | None:
    """Why `folder` is not the adapter whose two files have these sha256s; None when it is."""
    for name, sha256 in ((ADAPTER_CONFIG, config_sha256), (ADAPTER_WEIGHTS, weights_sha256)):
        file = folder / name
        if not file.is_file():
            return f"{file} is not readable on this host"
        if file_digest(file) != sha256.lower():
            return f"{file} on this host is another file (its sha256 differs)"
    return None


def fetch_adapter(
    config: tuple[str, str],
    weights: tuple[str, str],
    token: str,
    keep: Iterable[str | Path] = (),
    root: Path | None = None,
) -> Fetched:
    """The verified local folder of the adapter whose config and weights are at these (url,
    sha256): `<root>/<weights sha256>/` under peft's file names. Each file is downloaded as
    `fetch_verified` does (resumable, its sha256 checked) before it is moved in, and the folder
    is returned only once both files in it match. Then the other adapters under `root` are
    deleted, but those in `keep` (the ones the server has loaded: vLLM may read them again)."""
    t0 = time.perf_counter()
    root = root or adapters_dir()
    key = _checked_sha256(weights[1])
    folder = root / key
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / f"{key}.lock"):  # the workers of one server: the second finds it done
        fetched = []
        if adapter_mismatch(folder, config[1], weights[1]) is not None:
            fetched = _download_adapter(root / f"{key}.parts", folder, config, weights, token)
    _forget_adapters(root, keep=[folder, *(Path(k) for k in keep)])
    return Fetched(
        folder,
        sum(f.bytes_downloaded for f in fetched),
        sum(f.resumed_from for f in fetched),
        sum(f.attempts for f in fetched),
        time.perf_counter() - t0,
    )


def _download_adapter(
    parts: Path, folder: Path, config: tuple[str, str], weights: tuple[str, str], token: str
) -> list[Fetched]:
    """Both files, each verified, then moved into `folder` (only then: never half an adapter)."""
    fetched = {
        # each file in a folder of its own: fetch_verified forgets the other files of its folder
        name: fetch_verified(url, token, sha256, parts / name)
        for name, (url, sha256) in ((ADAPTER_CONFIG, config), (ADAPTER_WEIGHTS, weights))
    }
    folder.mkdir(exist_ok=True)
    for name, got in fetched.items():
        got.path.replace(folder / name)
    shutil.rmtree(parts, ignore_errors=True)
    return list(fetched.values())


def _forget_adapters(root: Path, keep: list[Path]) -> None:
    """Downloaded adapters (folders, cut-off parts, locks) but those in `keep`: every other one
    was unloaded, rolled back or abandoned, so vLLM reads it no more."""
    kept = {path.resolve() for path in keep}
    for entry in root.iterdir():
        key = entry.name.split(".", 1)[0]
        if not _SHA256.fullmatch(key) or (root / key).resolve() in kept:
            continue  # not a download of ours, or a kept adapter's folder, parts or lock
        if entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                entry.unlink()


class BackgroundAdapterFetch(BackgroundFetch):
    """`fetch_adapter` in a thread of the worker, polled like `BackgroundFetch`
    (`rlgw_fetch_adapter` answers "pending" until both files are in and verified)."""

    def __init__(
        self,
        config: tuple[str, str],
        weights: tuple[str, str],
        token: str,
        reason: str,
        keep: Iterable[str] = (),
    ) -> None:
        self.config, self.weights, self.keep = config, weights, tuple(keep)
        self.config_sha256 = config[1].lower()
        super().__init__(weights[0], token, weights[1], reason)

    def _fetch(self, url: str, token: str) -> Fetched:
        return fetch_adapter(self.config, self.weights, token, self.keep)

    def received(self) -> int:
        """Bytes of both files on disk so far."""
        parts = adapters_dir() / f"{self.sha256}.parts"
        try:
            return sum(p.stat().st_size for p in parts.glob("*/*.part"))
        except OSError:
            return 0
