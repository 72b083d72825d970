"""A free TCP port on this machine, for servers started by the demo, the benchmarks and tests."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (the kernel's pick; another process could take it first)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
