"""Helpers for tests with auth on: a gateway on a fake upstream, keys, clients."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import httpx

from gateway.main import create_app

from conftest import LiveServer, free_port, gateway_settings
from fakes import FAKE_MODEL, vllm_like

TOKEN_SECRET = "test-token-secret-0123456789-abcdefghij"
CHAT = {"model": FAKE_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@contextmanager
def auth_gateway(
    db_url: str, delay_s: float = 0.0, stream_gap_s: float = 0.0, **overrides
) -> Iterator[str]:
    settings = gateway_settings(db_url, auth="on", token_secret=TOKEN_SECRET, **overrides)
    app = create_app(
        settings, upstream_transport=httpx.MockTransport(vllm_like(delay_s, stream_gap_s))
    )
    with LiveServer(app, free_port()) as live:
        yield live.url


def mint_key(admin: httpx.Client, tenant: str, name: str | None = None) -> dict:
    reply = admin.post("/admin/agent_keys", json={"tenant": tenant, "name": name})
    assert reply.status_code == 201, reply.text
    return reply.json()


@contextmanager
def as_key(gw: str, key: str) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=gw, timeout=30, headers={"Authorization": f"Bearer {key}"}
    ) as client:
        yield client
