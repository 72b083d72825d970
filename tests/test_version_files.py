"""The trainer's version-file server and the backend's verified, resumable download of it."""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from rlgw.db.engine import make_sync_engine, sync_session_factory
from rlgw.db.migrate import upgrade
from rlgw.registry import store_model
from rlgw.settings import Settings
from trainer.fetch import BackgroundFetch, FetchError, fetch_verified
from trainer.publish import Publisher
from trainer.version_files import VersionFileServer, version_files_token, version_url
from trainer.versions import file_sha256, version_file
from trainer.weight_update.files import DeltaFile
from trainer.weight_update.remote import RemoteDelta

from conftest import ADMIN_KEY, MODEL_NAME, gateway_settings
from swap_helpers import random_delta

TOKEN = "file-token-0123456789abcdef"
MODEL = MODEL_NAME
SIZE = 3 * (1 << 20) + 12_345  # a few blocks and a ragged end


@pytest.fixture()
def served(tmp_path: Path) -> Iterator[tuple[VersionFileServer, Path, str]]:
    """A server on a free port over a state directory holding version 3's delta file."""
    home = tmp_path / "trainer-home"
    path = version_file(home, MODEL, 3, "delta")
    path.parent.mkdir(parents=True)
    path.write_bytes(os.urandom(SIZE))
    (home / "secret.txt").write_text("not a version file")
    with VersionFileServer(home, "127.0.0.1:0", TOKEN) as server:
        yield server, path, f"http://{server.bound}"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_request_without_a_token_is_401(served) -> None:
    server, _, base = served
    reply = httpx.get(version_url(base, MODEL, 3, "delta"))
    assert reply.status_code == 401
    assert reply.headers["WWW-Authenticate"].startswith("Bearer")
    assert server.bytes_sent == 0


def test_a_request_with_another_token_is_403(served) -> None:
    server, _, base = served
    reply = httpx.get(
        version_url(base, MODEL, 3, "delta"), headers={"Authorization": "Bearer wrong"}
    )
    assert reply.status_code == 403
    assert server.refusals == 1 and server.bytes_sent == 0


def test_the_file_is_served_whole_with_the_token(served) -> None:
    _, path, base = served
    reply = httpx.get(
        version_url(base, MODEL, 3, "delta"), headers={"Authorization": f"Bearer {TOKEN}"}
    )
    assert reply.status_code == 200
    assert reply.headers["Accept-Ranges"] == "bytes"
    assert reply.content == path.read_bytes()


def test_a_range_is_answered_206_with_its_bytes(served) -> None:
    _, path, base = served
    reply = httpx.get(
        version_url(base, MODEL, 3, "delta"),
        headers={"Authorization": f"Bearer {TOKEN}", "Range": "bytes=1000-"},
    )
    assert reply.status_code == 206
    assert reply.headers["Content-Range"] == f"bytes 1000-{SIZE - 1}/{SIZE}"
    assert reply.content == path.read_bytes()[1000:]
    beyond = httpx.get(
        version_url(base, MODEL, 3, "delta"),
        headers={"Authorization": f"Bearer {TOKEN}", "Range": f"bytes={SIZE}-"},
    )
    assert beyond.status_code == 416


@pytest.mark.parametrize(
    "url_path",
    [
        "/versions/tiny/3/secret",  # not a version kind
        "/versions/tiny/4/delta",  # no such version
        "/versions/../secret.txt/3/delta",
        "/versions/%2e%2e/3/delta",
        "/secret.txt",
    ],
)
def test_nothing_but_version_files_is_served(served, url_path: str) -> None:
    _, _, base = served
    reply = httpx.get(base + url_path, headers={"Authorization": f"Bearer {TOKEN}"})
    assert reply.status_code == 404
    assert b"not a version file" not in reply.content


def test_fetch_checks_the_sha256_and_keeps_nothing_on_a_mismatch(served, tmp_path) -> None:
    _, path, base = served
    folder = tmp_path / "backend-downloads"
    wrong = sha256(b"another file")
    with pytest.raises(FetchError, match="checksum mismatch"):
        fetch_verified(version_url(base, MODEL, 3, "delta"), TOKEN, wrong, folder)
    assert not list(folder.glob("*.safetensors")) and not list(folder.glob("*.part"))


def test_fetch_refuses_a_bad_token_clearly(served, tmp_path) -> None:
    _, path, base = served
    with pytest.raises(FetchError, match="HTTP 403, the version-file token was refused"):
        fetch_verified(
            version_url(base, MODEL, 3, "delta"), "wrong", sha256(path.read_bytes()), tmp_path
        )


def test_fetch_resumes_what_an_earlier_download_left(served, tmp_path) -> None:
    server, path, base = served
    data = path.read_bytes()
    digest = sha256(data)
    folder = tmp_path / "backend-downloads"
    folder.mkdir()
    half = SIZE // 2
    (folder / f"{digest}.part").write_bytes(data[:half])  # what a cut-off download left
    fetched = fetch_verified(version_url(base, MODEL, 3, "delta"), TOKEN, digest, folder)
    assert fetched.resumed_from == half
    assert fetched.bytes_downloaded == SIZE - half
    assert server.bytes_sent == SIZE - half  # the first half never crossed the network again
    assert fetched.path.read_bytes() == data


def test_a_corrupt_partial_download_is_discarded(served, tmp_path) -> None:
    _, path, base = served
    data = path.read_bytes()
    digest = sha256(data)
    folder = tmp_path / "backend-downloads"
    folder.mkdir()
    (folder / f"{digest}.part").write_bytes(b"\0" * 1000)  # not the file's first bytes
    with pytest.raises(FetchError, match="checksum mismatch"):
        fetch_verified(version_url(base, MODEL, 3, "delta"), TOKEN, digest, folder)
    assert not (folder / f"{digest}.part").exists()
    # the next attempt starts over and succeeds
    fetched = fetch_verified(version_url(base, MODEL, 3, "delta"), TOKEN, digest, folder)
    assert fetched.resumed_from == 0 and fetched.path.read_bytes() == data


class CuttingProxy:
    """A TCP proxy that cuts its first connection after `cut_after` bytes from the server: the
    fault (a dropped connection mid-download) that the real server cannot produce on demand."""

    def __init__(self, target: str, cut_after: int) -> None:
        host, _, port = target.rpartition(":")
        self.target = (host, int(port))
        self.cut_after = cut_after
        self.connections = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            limit = self.cut_after if self.connections == 1 else None
            threading.Thread(target=self._pipe, args=(client, limit), daemon=True).start()

    def _pipe(self, client: socket.socket, limit: int | None) -> None:
        upstream = socket.create_connection(self.target)
        threading.Thread(target=self._forward, args=(client, upstream), daemon=True).start()
        sent = 0
        try:
            while chunk := upstream.recv(65536):
                if limit is not None and sent + len(chunk) > limit:
                    client.sendall(chunk[: limit - sent])
                    break
                client.sendall(chunk)
                sent += len(chunk)
        except OSError:
            pass
        finally:  # shutdown, not just close: the forwarding thread still holds both sockets
            for sock in (client, upstream):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()

    @staticmethod
    def _forward(src: socket.socket, dst: socket.socket) -> None:
        try:
            while chunk := src.recv(65536):
                dst.sendall(chunk)
        except OSError:
            pass

    def close(self) -> None:
        self.listener.close()


def test_fetch_resumes_a_connection_cut_mid_download(served, tmp_path) -> None:
    server, path, _ = served
    data = path.read_bytes()
    proxy = CuttingProxy(server.bound, cut_after=SIZE // 3)
    try:
        fetched = fetch_verified(
            version_url(proxy.url, MODEL, 3, "delta"), TOKEN, sha256(data), tmp_path
        )
    finally:
        proxy.close()
    assert proxy.connections == 2
    assert fetched.attempts == 2
    assert fetched.path.read_bytes() == data
    # the second connection asked only for the rest: about a third came twice at most
    assert fetched.bytes_downloaded < SIZE + SIZE // 3


def test_the_token_is_generated_once_and_private(tmp_path) -> None:
    settings = Settings(home=tmp_path)
    token = version_files_token(settings)
    assert len(token) >= 32
    assert version_files_token(settings) == token
    mode = stat.S_IMODE((tmp_path / "version-files.token").stat().st_mode)
    assert mode == 0o600


def test_the_admin_key_is_refused_as_the_file_token() -> None:
    with pytest.raises(ValueError, match="must not be the admin key"):
        Settings(admin_key="an-admin-key-0123456789", version_files_token="an-admin-key-0123456789")


def test_the_publisher_offers_recorded_files_over_http_only_when_it_serves_them(
    make_database, tiny_model_dir, tmp_path
) -> None:
    db_url = make_database()
    upgrade(db_url)
    engine = make_sync_engine(db_url)
    try:
        with sync_session_factory(engine)() as db, db.begin():
            store_model(db, MODEL_NAME, [], model_path=str(tiny_model_dir), replace=False)
        plain = gateway_settings(db_url).model_copy(update={"home": tmp_path})
        serving = plain.model_copy(update={"version_files_bind": "127.0.0.1:0"})
        delta = random_delta(tiny_model_dir, seed=3)
        with Publisher(plain, engine, MODEL_NAME) as publisher:
            published = publisher.record(0, delta, DeltaFile)
            assert publisher.offered(published.update, 1) is published.update
        with Publisher(serving, engine, MODEL_NAME) as publisher:
            offered = publisher.offered(published.update, 1)
            elsewhere = DeltaFile(tmp_path / "not-a-version-file.safetensors")
            assert publisher.offered(elsewhere, 1) is elsewhere
            url, token = offered.url, offered.token
            assert isinstance(offered, RemoteDelta) and offered.relative
            assert offered.path == published.update.path
            assert offered.sha256 == file_sha256(published.update.path)  # the recorded checksum
            reply = httpx.get(url, headers={"Authorization": f"Bearer {token}"})
            assert reply.content == Path(published.update.path).read_bytes()
        assert token == version_files_token(serving) != ADMIN_KEY
    finally:
        engine.dispose()


def test_a_background_fetch_downloads_in_a_thread_and_reports_its_progress(
    served, tmp_path, monkeypatch
) -> None:
    _, path, base = served
    url, data = version_url(base, MODEL, 3, "delta"), path.read_bytes()
    monkeypatch.setenv("RLGW_HOME", str(tmp_path / "backend-home"))
    fetch = BackgroundFetch(url, TOKEN, sha256(data), "why")
    fetch._thread.join(timeout=60)
    assert fetch.done and fetch.error is None
    assert fetch.result.path.parent == tmp_path / "backend-home" / "downloads"
    assert fetch.result.path.read_bytes() == data
    assert fetch.received() == 0  # the part became the verified file
    monkeypatch.setenv("RLGW_HOME", str(tmp_path / "another-backend"))
    failed = BackgroundFetch(url, "wrong", sha256(data), "why")
    failed._thread.join(timeout=60)
    assert failed.result is None and "HTTP 403" in str(failed.error)
