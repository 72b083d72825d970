"""A TCP forwarder in front of Postgres that can cut, refuse, black-hole or resume connections."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

# psycopg sends COMMIT as a simple Query message: 'Q', int32 length (4 + 7), "COMMIT\0".
COMMIT_MESSAGE = b"Q\x00\x00\x00\x0bCOMMIT\x00"
# The recorder's one-statement write of implicit records commits by itself, outside a transaction
# (gateway/recording/implicit_batch.py): its Parse message, which carries this text, is the
# commit as much as a COMMIT is.
IMPLICIT_WRITE = b"WITH implicit_sessions AS (INSERT INTO sessions"
COMMITTING = (COMMIT_MESSAGE, IMPLICIT_WRITE)
FORWARD, REFUSE, BLACKHOLE = "forward", "refuse", "blackhole"


class _Link:
    """One client connection and its connection to the server."""

    def __init__(self, client: asyncio.StreamWriter) -> None:
        self.client = client
        self.server: asyncio.StreamWriter | None = None
        self.mute_server = False  # discard the server's answer (then cut): a COMMIT was trapped

    def cut(self) -> None:
        for writer in (self.client, self.server):
            if writer is not None and not writer.transport.is_closing():
                writer.transport.abort()


class PgFaultProxy:
    """Listens on 127.0.0.1:<port> and forwards to `target`. Thread-safe controls:

    - `cut()`: abort every open connection (what a server restart does to its clients);
    - `refuse()` / `blackhole()`: new connections are closed at once / accepted and never answered;
    - `resume()`: forward new connections again;
    - `trap_commit(nth, forward, then)`: the `nth` COMMIT (or self-committing write) from now is
      either forwarded and its answer swallowed (the transaction commits, the client never
      learns it) or dropped (it rolls back), and its connection is cut; `then` is the mode
      afterwards (refusing or black-holing: the database is away, so every other open
      connection is cut too, as by `outage()`).
    """

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.mode = FORWARD
        self.port = 0
        self.refused = 0
        self.trap_sprung = threading.Event()
        self._trap: dict[str, Any] | None = None
        self._links: set[_Link] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="pgproxy")
        self._server: asyncio.Server | None = None

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> PgFaultProxy:
        self._thread.start()
        self._server = self._call(self._listen())
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc: object) -> None:
        self._call(self._close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()

    def url_for(self, database_url: str) -> str:
        """`database_url` with its host and port replaced by the proxy's."""
        scheme, _, rest = database_url.partition("://")
        userinfo, _, hostpart = rest.rpartition("@")
        _, _, path = hostpart.partition("/")
        prefix = f"{userinfo}@" if userinfo else ""
        return f"{scheme}://{prefix}127.0.0.1:{self.port}/{path}"

    # ------------------------------------------------------------------ controls

    def cut(self) -> None:
        self._run_in_loop(self._cut_all)

    def refuse(self) -> None:
        self._run_in_loop(lambda: setattr(self, "mode", REFUSE))

    def blackhole(self) -> None:
        self._run_in_loop(lambda: setattr(self, "mode", BLACKHOLE))

    def resume(self) -> None:
        self._run_in_loop(lambda: setattr(self, "mode", FORWARD))

    def outage(self) -> None:
        """Postgres gone: cut what is open and refuse what comes."""
        self.refuse()
        self.cut()

    def trap_commit(self, *, nth: int = 1, forward: bool, then: str = FORWARD) -> None:
        self.trap_sprung.clear()
        trap = {"left": nth, "forward": forward, "then": then}
        self._run_in_loop(lambda: setattr(self, "_trap", trap))

    # ------------------------------------------------------------------ internals

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=10)

    def _run_in_loop(self, fn: Callable[[], None]) -> None:
        async def run() -> None:
            fn()

        self._call(run())

    async def _listen(self) -> asyncio.Server:
        return await asyncio.start_server(self._accept, "127.0.0.1", 0)

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        self._cut_all()
        for _ in range(200):  # let every connection's task see its cut and end
            if not self._links:
                break
            await asyncio.sleep(0.01)

    def _away_but(self, trapped: _Link) -> None:
        """After a trap: if the database is now away, the other open connections go too."""
        if self.mode != FORWARD:
            for link in list(self._links):
                if link is not trapped:
                    link.cut()

    def _cut_all(self) -> None:
        for link in list(self._links):
            link.cut()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link = _Link(writer)
        self._links.add(link)
        try:
            if self.mode == REFUSE:
                self.refused += 1
                return
            if self.mode == BLACKHOLE:
                await reader.read()  # hold the connection, answer nothing, until the client quits
                return
            try:
                s_reader, link.server = await asyncio.open_connection(*self.target)
            except OSError:
                return
            await asyncio.gather(
                self._client_to_server(link, reader), self._server_to_client(link, s_reader)
            )
        finally:
            link.cut()
            self._links.discard(link)

    def _spring(self, data: bytes) -> bool | None:
        """None: forward `data` as usual. True/False: a trapped COMMIT to forward / to drop."""
        trap = self._trap
        if trap is None or not any(marker in data for marker in COMMITTING):
            return None
        trap["left"] -= 1
        if trap["left"] > 0:
            return None
        self._trap = None
        self.mode = trap["then"]
        return trap["forward"]

    async def _client_to_server(self, link: _Link, reader: asyncio.StreamReader) -> None:
        assert link.server is not None
        try:
            while data := await reader.read(65536):
                sprung = self._spring(data)
                if sprung is False:
                    self.trap_sprung.set()
                    self._away_but(link)
                    break
                if sprung:
                    link.mute_server = True
                link.server.write(data)
                await link.server.drain()
                if sprung:
                    self._away_but(link)
        except (ConnectionError, OSError):
            pass
        finally:
            if not link.mute_server:
                link.cut()

    async def _server_to_client(self, link: _Link, reader: asyncio.StreamReader) -> None:
        try:
            while data := await reader.read(65536):
                if link.mute_server:  # the server's answer to the trapped COMMIT: swallow it
                    self.trap_sprung.set()
                    break
                link.client.write(data)
                await link.client.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            link.cut()
