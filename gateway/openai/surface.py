"""The OpenAI chat and text completions surfaces: the client's body goes to the backend as it is
(plus what recording needs), and the backend's reply comes back as it is."""

from __future__ import annotations

from typing import Any

from ..proxy.shaping import CHAT, COMPLETIONS, client_asks
from ..proxy.surface import Surface

RECORD_PREFIX = {CHAT: "chatcmpl-", COMPLETIONS: "cmpl-"}


class OpenAISurface(Surface):
    def __init__(self, api: str, body: dict[str, Any]) -> None:
        super().__init__(
            api=api,
            wire=api,
            body=body,
            wire_body=body,
            asks=client_asks(api, body),
            record_prefix=RECORD_PREFIX[api],
        )
