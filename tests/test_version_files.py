"""The trainer's version-file server and the backend's verified, resumable download of it."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from migrations.runner import upgrade
from rlgw.db.engine import make_sync_engine, sync_session_factory
from rlgw.db.models import PolicyVersion
from rlgw.registry import store_model
from rlgw.settings import Settings
from rlgw_vllm import fetch
from rlgw_vllm.extension import WeightUpdateExtension
from rlgw_vllm.fetch import (
    BackgroundAdapterFetch,
    BackgroundFetch,
    FetchError,
    fetch_adapter,
    fetch_verified,
)
from trainer.publishing import publish
from trainer.publishing.publish import Publisher
from trainer.publishing.version_files import VersionFileServer, version_files_token, version_url
from trainer.publishing.versions import file_sha256, version_file
from trainer.weight_update.files import DeltaFile
from trainer.weight_update.lora import CONFIG_FILE, WEIGHTS_FILE, LoraAdapter
from trainer.weight_update.remote import RemoteDelta, RemoteLora

from conftest import ADMIN_KEY, MODEL_NAME, gateway_settings
from swap_helpers import random_adapter, random_delta

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


@pytest.fixture()
def publishing(make_database, tiny_model_dir, tmp_path):
    """A migrated database with the tiny model registered: its engine, settings without a
    version-file server, and the same settings serving version files."""
    db_url = make_database()
    upgrade(db_url)
    engine = make_sync_engine(db_url)
    try:
        with sync_session_factory(engine)() as db, db.begin():
            store_model(db, MODEL_NAME, [], model_path=str(tiny_model_dir), replace=False)
        plain = gateway_settings(db_url).model_copy(update={"home": tmp_path})
        yield engine, plain, plain.model_copy(update={"version_files_bind": "127.0.0.1:0"})
    finally:
        engine.dispose()


def test_the_publisher_offers_recorded_files_over_http_only_when_it_serves_them(
    publishing, tiny_model_dir, tmp_path
) -> None:
    engine, plain, serving = publishing
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


class SlowDelta(DeltaFile):
    """A delta file whose write takes at least WRITE_S longer."""

    @classmethod
    def write(cls, *args, **kwargs):
        time.sleep(WRITE_S)
        return super().write(*args, **kwargs)


WRITE_S, CHECKSUM_S, COMMIT_S = 0.15, 0.3, 0.45


def test_the_publisher_times_the_write_the_checksum_and_the_commit(
    publishing, tiny_model_dir, monkeypatch
) -> None:
    """Each part is slowed by its own delay: each timing holds its own part and only it."""
    engine, plain, _ = publishing
    real_sha256 = publish.file_sha256

    def slow_sha256(path):
        time.sleep(CHECKSUM_S)
        return real_sha256(path)

    monkeypatch.setattr(publish, "file_sha256", slow_sha256)
    with Publisher(plain, engine, MODEL_NAME) as publisher:
        started = time.perf_counter()
        published = publisher.record(
            0,
            random_delta(tiny_model_dir, seed=4),
            SlowDelta,
            rows=lambda db, version: time.sleep(COMMIT_S),  # the caller's rows: in the commit
        )
        elapsed = time.perf_counter() - started
    timings = published.timings
    assert list(timings) == ["write", "checksum", "commit"]
    assert timings["write"] >= WRITE_S
    assert timings["checksum"] >= CHECKSUM_S
    assert timings["commit"] >= COMMIT_S
    assert sum(timings.values()) <= elapsed  # disjoint: no part counted twice
    with sync_session_factory(engine)() as db:  # what was timed is what was recorded
        recorded = db.scalar(select(PolicyVersion.checksum).where(PolicyVersion.version == 1))
    assert recorded == file_sha256(published.update.path)


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


# ---------------------------------------------------------------------- LoRA versions

LORA = 5  # the version the `adapter` fixture stores as a LoRA adapter folder


@pytest.fixture()
def adapter(served) -> tuple[VersionFileServer, Path, str]:
    """The `served` server, its state directory also holding version 5 as an adapter folder."""
    server, _, base = served
    folder = version_file(server.home, MODEL, LORA, "lora")
    folder.mkdir()
    (folder / CONFIG_FILE).write_text(json.dumps({"r": 8, "peft_type": "LORA"}))
    (folder / WEIGHTS_FILE).write_bytes(os.urandom(SIZE))
    return server, folder, base


def _lora_urls(base: str) -> list[str]:
    """The URLs of the `adapter` fixture's config and weights."""
    return [version_url(base, MODEL, LORA, kind) for kind in ("lora-config", "lora-weights")]


def _shas(folder: Path) -> list[str]:
    """The sha256 of an adapter folder's config and weights."""
    return [file_sha256(folder / name) for name in (CONFIG_FILE, WEIGHTS_FILE)]


def test_the_worker_and_the_trainer_name_an_adapters_files_alike() -> None:
    assert (fetch.ADAPTER_CONFIG, fetch.ADAPTER_WEIGHTS) == (CONFIG_FILE, WEIGHTS_FILE)


def test_a_lora_versions_two_files_are_served_with_the_token(adapter) -> None:
    _, folder, base = adapter
    auth = {"Authorization": f"Bearer {TOKEN}"}
    config_url, weights_url = _lora_urls(base)
    assert httpx.get(config_url, headers=auth).content == (folder / CONFIG_FILE).read_bytes()
    reply = httpx.get(weights_url, headers=auth)
    assert reply.status_code == 200 and reply.headers["Accept-Ranges"] == "bytes"
    assert reply.content == (folder / WEIGHTS_FILE).read_bytes()
    head = httpx.head(weights_url, headers=auth)
    assert head.status_code == 200 and int(head.headers["Content-Length"]) == SIZE


@pytest.mark.parametrize("kind", ["lora-config", "lora-weights"])
def test_a_lora_file_needs_the_token(adapter, kind: str) -> None:
    server, _, base = adapter
    url = version_url(base, MODEL, LORA, kind)
    assert httpx.get(url).status_code == 401
    assert httpx.get(url, headers={"Authorization": "Bearer wrong"}).status_code == 403
    assert server.refusals == 2 and server.bytes_sent == 0


def test_a_range_of_the_adapters_weights_is_answered_206(adapter) -> None:
    _, folder, base = adapter
    reply = httpx.get(
        _lora_urls(base)[1], headers={"Authorization": f"Bearer {TOKEN}", "Range": "bytes=7-99"}
    )
    assert reply.status_code == 206
    assert reply.headers["Content-Range"] == f"bytes 7-99/{SIZE}"
    assert reply.content == (folder / WEIGHTS_FILE).read_bytes()[7:100]


@pytest.mark.parametrize(
    "url_path",
    [
        f"/versions/tiny/{LORA}/lora",  # the folder itself is no file
        f"/versions/tiny/{LORA}/delta",  # a LoRA version has no delta file
        "/versions/tiny/3/lora-weights",  # version 3 is a delta, it has no adapter
        "/versions/tiny/4/lora-config",  # no such version
        f"/versions/tiny/{LORA}/lora-readme",  # not a kind
        f"/versions/tiny/{LORA}/adapter_model.safetensors",  # a file name is no kind
        f"/versions/tiny/{LORA}/lora/adapter_config.json",
        f"/versions/tiny/{LORA}/lora-weights%2f..%2f..%2f3%2fdelta",
    ],
)
def test_nothing_else_of_a_lora_version_is_served(adapter, url_path: str) -> None:
    _, _, base = adapter
    reply = httpx.get(base + url_path, headers={"Authorization": f"Bearer {TOKEN}"})
    assert reply.status_code == 404
    assert reply.content == b"no such version file\n"


def test_fetch_adapter_makes_a_verified_peft_folder_and_keeps_it(adapter, tmp_path) -> None:
    server, folder, base = adapter
    config_sha, weights_sha = _shas(folder)
    config_url, weights_url = _lora_urls(base)
    root = tmp_path / "adapters"
    got = fetch_adapter((config_url, config_sha), (weights_url, weights_sha), TOKEN, root=root)
    assert got.path == root / weights_sha
    assert sorted(p.name for p in got.path.iterdir()) == sorted([CONFIG_FILE, WEIGHTS_FILE])
    assert (got.path / WEIGHTS_FILE).read_bytes() == (folder / WEIGHTS_FILE).read_bytes()
    assert got.bytes_downloaded == server.bytes_sent == SIZE + (folder / CONFIG_FILE).stat().st_size
    assert got.attempts == 2
    assert sorted(p.name for p in root.iterdir()) == [weights_sha, f"{weights_sha}.lock"]
    again = fetch_adapter((config_url, config_sha), (weights_url, weights_sha), TOKEN, root=root)
    assert (again.path, again.attempts, again.bytes_downloaded) == (got.path, 0, 0)


def test_fetch_adapter_refuses_a_mismatch_and_makes_no_folder(adapter, tmp_path) -> None:
    _, folder, base = adapter
    config_sha, _ = _shas(folder)
    config_url, weights_url = _lora_urls(base)
    wrong = sha256(b"another adapter")
    root = tmp_path / "adapters"
    with pytest.raises(FetchError, match="checksum mismatch .* nothing was read"):
        fetch_adapter((config_url, config_sha), (weights_url, wrong), TOKEN, root=root)
    assert not (root / wrong).exists()
    assert not list(root.rglob("*.part"))  # the verified config is kept for the next attempt
    with pytest.raises(FetchError, match="HTTP 403, the version-file token was refused"):
        fetch_adapter((config_url, config_sha), (weights_url, wrong), "wrong", root=root)
    with pytest.raises(FetchError, match="not a sha256"):
        fetch_adapter((config_url, config_sha), (weights_url, "../../etc"), TOKEN, root=root)


def test_a_new_adapter_deletes_the_downloaded_ones_the_server_no_longer_has(
    adapter, tmp_path
) -> None:
    _, folder, base = adapter
    config_sha, weights_sha = _shas(folder)
    root = tmp_path / "adapters"
    loaded, unloaded = root / ("a" * 64), root / ("b" * 64)
    for old in (loaded, unloaded):
        old.mkdir(parents=True)
        (old / WEIGHTS_FILE).write_bytes(b"an older version")
    (root / f"{'c' * 64}.parts").mkdir()  # an abandoned download's parts
    (root / "not-ours").mkdir()  # nothing the worker wrote: never touched
    config_url, weights_url = _lora_urls(base)
    got = fetch_adapter(
        (config_url, config_sha), (weights_url, weights_sha), TOKEN, keep=[str(loaded)], root=root
    )
    names = sorted(p.name for p in root.iterdir())
    assert names == sorted(["a" * 64, weights_sha, f"{weights_sha}.lock", "not-ours"])
    assert got.path.is_dir() and (loaded / WEIGHTS_FILE).is_file()


def test_the_worker_reads_a_matching_adapter_path_and_downloads_otherwise(
    adapter, tmp_path, monkeypatch
) -> None:
    server, folder, base = adapter
    monkeypatch.setenv("RLGW_HOME", str(tmp_path / "backend-home"))
    config_sha, weights_sha = _shas(folder)
    config_url, weights_url = _lora_urls(base)
    worker = WeightUpdateExtension()  # rlgw_fetch_adapter needs no model

    def ask(path: str, token: str = TOKEN) -> dict:
        for _ in range(400):
            answer = worker.rlgw_fetch_adapter(
                config_url, config_sha, weights_url, weights_sha, token, path=path
            )
            if not answer.get("pending"):
                return answer
            assert answer["delivery"] == "http" and answer["received"] >= 0
            threading.Event().wait(0.05)
        raise AssertionError("the download never ended")

    by_path = ask(str(folder))
    assert by_path == {
        "ok": True,
        "folder": str(folder),
        "delivery": "path",
        "delivery_reason": f"{folder} on this host has the version's sha256s",
        "downloaded": 0,
    }
    assert server.bytes_sent == 0
    gone = ask(str(tmp_path / "elsewhere"))
    assert gone["ok"] and gone["delivery"] == "http"
    assert "adapter_config.json is not readable on this host" in gone["delivery_reason"]
    assert gone["folder"] == str(tmp_path / "backend-home" / "downloads" / "adapters" / weights_sha)
    assert gone["downloaded"] == SIZE + (folder / CONFIG_FILE).stat().st_size
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / CONFIG_FILE).write_text("{}")
    other = ask(str(tmp_path / "other"))
    assert "is another file (its sha256 differs)" in other["delivery_reason"]
    assert other["downloaded"] == 0  # the verified copy was already there
    again = ask("", token="wrong")  # the verified copy is there: nothing is asked of the server
    assert again["ok"] and again["downloaded"] == 0 and server.refusals == 0
    worker_b = WeightUpdateExtension()
    monkeypatch.setenv("RLGW_HOME", str(tmp_path / "another-backend"))
    answer = worker_b.rlgw_fetch_adapter(
        config_url, config_sha, weights_url, weights_sha, "wrong", path=""
    )
    while answer.get("pending"):
        threading.Event().wait(0.05)
        answer = worker_b.rlgw_fetch_adapter(
            config_url, config_sha, weights_url, weights_sha, "wrong", path=""
        )
    assert not answer["ok"] and "HTTP 403" in answer["error"]
    assert answer["error"].startswith("the trainer offered no path; fetching it: ")


def test_a_background_adapter_fetch_reports_its_progress_and_result(
    adapter, tmp_path, monkeypatch
) -> None:
    _, folder, base = adapter
    monkeypatch.setenv("RLGW_HOME", str(tmp_path / "backend-home"))
    config_sha, weights_sha = _shas(folder)
    config_url, weights_url = _lora_urls(base)
    job = BackgroundAdapterFetch((config_url, config_sha), (weights_url, weights_sha), TOKEN, "why")
    job._thread.join(timeout=60)
    assert job.done and job.error is None and job.received() == 0
    assert job.result.path == tmp_path / "backend-home" / "downloads" / "adapters" / weights_sha


def test_the_publisher_offers_a_stored_lora_version_over_http_only_when_it_serves_files(
    publishing, tiny_model_dir, tmp_path
) -> None:
    engine, plain, serving = publishing
    model = random_adapter(tiny_model_dir, rank=4, seed=5)
    with Publisher(plain, engine, MODEL_NAME) as publisher:
        published = publisher.record(0, model, LoraAdapter)
        assert publisher.offered(published.update, 1) is published.update
    folder = Path(published.update.path)
    with Publisher(serving, engine, MODEL_NAME) as publisher:
        offered = publisher.offered(published.update, 1)
        elsewhere = LoraAdapter(tmp_path / "not-a-version", MODEL_NAME, 1)
        assert publisher.offered(elsewhere, 1) is elsewhere
        assert isinstance(offered, RemoteLora) and not offered.relative
        assert (offered.path, offered.name) == (str(folder), published.update.name)
        assert offered.weights.sha256 == file_sha256(folder / WEIGHTS_FILE)  # recorded
        assert offered.config.sha256 == file_sha256(folder / CONFIG_FILE)
        assert offered.token == version_files_token(serving) != ADMIN_KEY
        assert offered.token not in repr(offered)
        auth = {"Authorization": f"Bearer {offered.token}"}
        for served_file, name in (
            (offered.config, CONFIG_FILE),
            (offered.weights, WEIGHTS_FILE),
        ):
            reply = httpx.get(served_file.url, headers=auth)
            assert reply.content == (folder / name).read_bytes()
