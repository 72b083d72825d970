"""The trainer's version-file server: its version files over HTTP, for backends on other hosts.

    GET|HEAD /versions/<model>/<version>/<kind>      kind: delta | full | anchor
                                                      | lora-config | lora-weights
    Authorization: Bearer <token>                     401 without it, 403 with another
    Range: bytes=<start>-[<end>]                      206 and Content-Range (a download resumes)

It serves only the files named by `versions.version_file` under its state directory, picked by
model, version number and kind (a LoRA version's folder holds two files, one kind each, under
peft's fixed names): no path from the request reaches the file system, so nothing else on the
trainer's disk can be read, with or without the token. The token reads version
files and nothing else: it is not the admin key (settings refuse that) and it opens no control
endpoint. Integrity is not the server's job: the backend checks each file's sha256 against the
version's recorded checksum before it reads a tensor (`rlgw_vllm/fetch.py`).
"""

from __future__ import annotations

import hmac
import os
import re
import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from rlgw.settings import Settings

from ..weight_update.lora import CONFIG_FILE, WEIGHTS_FILE
from .versions import version_file

FILE_KINDS = ("delta", "full", "anchor")  # a version's one safetensors file
LORA_FILES = {"lora-config": CONFIG_FILE, "lora-weights": WEIGHTS_FILE}  # in its "lora" folder
SERVED_KINDS = (*FILE_KINDS, *LORA_FILES)
TOKEN_FILE = "version-files.token"
_ROUTE = re.compile(
    r"^/versions/(?P<model>[A-Za-z0-9_-][A-Za-z0-9._-]{0,127})/(?P<version>\d{1,9})/(?P<kind>[a-z-]{1,16})$"
)
_RANGE = re.compile(r"^bytes=(?P<start>\d+)-(?P<end>\d*)$")
_CHUNK = 1 << 20


def version_files_token(settings: Settings) -> str:
    """The configured token, else the one kept in <home>/version-files.token (made once, 0600)."""
    if settings.version_files_token:
        return settings.version_files_token
    path = settings.home / TOKEN_FILE
    if path.is_file():
        token = path.read_text().strip()
        if token:
            return token
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


def file_kind(path: str | Path) -> str | None:
    """The kind part of a version file's name (`v000003-delta.safetensors` -> "delta")."""
    stem = Path(path).name.removesuffix(".safetensors")
    kind = stem.rpartition("-")[2]
    return kind if kind in FILE_KINDS else None


def served_file(home: Path, model: str, version: int, kind: str) -> Path | None:
    """The one file a request for `kind` of `version` may read; None for any other kind."""
    if kind in LORA_FILES:
        return version_file(home, model, version, "lora") / LORA_FILES[kind]
    if kind in FILE_KINDS:
        return version_file(home, model, version, kind)
    return None


class _Handler(BaseHTTPRequestHandler):
    server: VersionFileServer  # type: ignore[assignment]

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the stdlib's name
        pass  # a log line per request would drown the trainer's log; refusals are counted

    def do_HEAD(self) -> None:  # noqa: N802 - the stdlib's naming
        self._serve(body=False)

    def do_GET(self) -> None:  # noqa: N802
        self._serve(body=True)

    def _refuse(self, status: int, message: str) -> None:
        data = (message + "\n").encode()
        self.send_response(status)
        if status == 401:
            self.send_header("WWW-Authenticate", 'Bearer realm="rlgw version files"')
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _serve(self, *, body: bool) -> None:
        auth = self.headers.get("Authorization", "")
        if not auth.startswith("Bearer "):
            self.server.refusals += 1
            return self._refuse(401, "a bearer token is required")
        if not hmac.compare_digest(auth[7:].strip().encode(), self.server.token.encode()):
            self.server.refusals += 1
            return self._refuse(403, "this token does not read version files")
        route = _ROUTE.match(self.path)
        path = None
        if route is not None:
            version = int(route["version"])
            path = served_file(self.server.home, route["model"], version, route["kind"])
        if path is None:
            return self._refuse(404, "no such version file")
        try:
            f = path.open("rb")
        except OSError:
            return self._refuse(404, "no such version file")
        with f:
            size = os.fstat(f.fileno()).st_size
            start, end = 0, size - 1
            wanted = self.headers.get("Range")
            if wanted is not None:
                rng = _RANGE.match(wanted.strip())
                if rng is None or int(rng["start"]) >= max(size, 1):
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{size}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return None
                start = int(rng["start"])
                end = min(int(rng["end"]), size - 1) if rng["end"] else size - 1
            length = end - start + 1
            self.send_response(206 if wanted is not None else 200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Length", str(length))
            if wanted is not None:
                self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
            self.end_headers()
            if body:
                f.seek(start)
                self._copy(f, length)
        return None

    def _copy(self, src, length: int) -> None:
        left = length
        while left > 0:
            block = src.read(min(_CHUNK, left))
            if not block:
                break
            self.server.bytes_sent += len(block)  # counted before the client can have it
            self.wfile.write(block)
            left -= len(block)


class VersionFileServer(ThreadingHTTPServer):
    """Serves one state directory's version files from a daemon thread; `with` starts and stops."""

    daemon_threads = True

    def __init__(self, home: Path, bind: str, token: str) -> None:
        host, _, port = bind.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"RLGW_VERSION_FILES_BIND must be host:port, not {bind!r}")
        super().__init__((host.strip("[]"), int(port)), _Handler)
        self.home, self.token = Path(home), token
        self.refusals = 0  # requests refused for their token
        self.bytes_sent = 0
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)

    @property
    def bound(self) -> str:
        host, port = self.server_address[:2]
        return f"{host}:{port}"

    def __enter__(self) -> VersionFileServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._thread.is_alive():
            self.shutdown()
            self._thread.join(timeout=10)
        self.server_close()


def version_url(base_url: str, model: str, version: int, kind: str) -> str:
    return f"{base_url.rstrip('/')}/versions/{model}/{version}/{kind}"
