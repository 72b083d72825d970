"""Watching the client while a non-streamed answer is generated: a hang-up cancels the request."""

from __future__ import annotations

import asyncio
from typing import Any


class ClientGone(Exception):
    """The client hung up while its answer was being generated."""


async def _wait_for_disconnect(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_client_leaves(work: Any, receive: Any) -> Any:
    """Await `work`, cancelling it (and so the backend request) if the client disconnects."""
    if receive is None:
        return await work
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(receive))
    gone = False
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        # Both can be done at once (a busy event loop saw the answer and the hang-up together):
        # the client left, so it will not receive this answer, whatever came back.
        gone = watcher.done() and not watcher.cancelled() and watcher.exception() is None
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
    if gone or not task.done() or task.cancelled():
        raise ClientGone
    return task.result()
