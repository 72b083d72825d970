"""A real HTTP backend on a loopback socket that answers with a scripted fault (a cut stream, a
stall, a hang-up): what the gateway's own upstream client meets from a failing server."""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from collections.abc import Callable

Script = Callable[[socket.socket, bytes], None]  # (connection, request head) -> writes an answer


def read_request(conn: socket.socket) -> bytes:
    """The request's head and body (Content-Length), read whole."""
    data = b""
    while b"\r\n\r\n" not in data:
        part = conn.recv(65536)
        if not part:
            return data
        data += part
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(body) < length:
        part = conn.recv(65536)
        if not part:
            break
        body += part
    return head


def chunk(data: bytes) -> bytes:
    """One chunk of a chunked transfer encoding."""
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)


def respond(status: int, body: bytes, content_type: str = "application/json") -> bytes:
    return (
        f"HTTP/1.1 {status} X\r\ncontent-type: {content_type}\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode() + body


class RawBackend:
    """Serves `script` for every request but GET /health (200) on 127.0.0.1, one thread per
    connection; `closed` is set when a connection was found closed by the client."""

    def __init__(self, script: Script) -> None:
        backend = self
        self.closed = threading.Event()

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                conn: socket.socket = self.request
                head = read_request(conn)
                if head.startswith(b"GET /health"):
                    conn.sendall(respond(200, b""))
                    return
                try:
                    script(conn, head)
                except OSError:
                    backend.closed.set()

        socketserver.ThreadingTCPServer.allow_reuse_address = True
        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def wait_until_closed(conn: socket.socket, timeout_s: float) -> bool:
    """Whether the client closed `conn` within `timeout_s` (reads see EOF or a reset)."""
    conn.settimeout(0.05)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if conn.recv(1024) == b"":
                return True
        except TimeoutError:
            continue
        except OSError:
            return True
    return False
