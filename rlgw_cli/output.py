"""How commands speak: progress lines and notices go to stderr, so stdout carries only a
command's result (a key, JSON Lines, a table); expected failures are one line and an exit code."""

from __future__ import annotations

import sys


def info(message: str) -> None:
    """A progress line or notice (stderr)."""
    print(message, file=sys.stderr, flush=True)


class CommandError(Exception):
    """An expected failure: printed as one line (no traceback), then exit with `code`."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code
