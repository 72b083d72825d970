"""Admin routes need the admin key: 401 without, 403 when wrong, never echoing it."""

from __future__ import annotations

import httpx
import pytest

from conftest import ADMIN_KEY


@pytest.fixture(scope="module")
def http(gateway_url: str):
    with httpx.Client(base_url=gateway_url, timeout=30) as client:
        yield client


def test_no_key_gets_401(http):
    reply = http.get("/admin/completions/chatcmpl-x")
    assert reply.status_code == 401
    assert reply.json()["error"]["type"] == "authentication_error"


def test_wrong_key_gets_403_without_echo(http):
    reply = http.get("/admin/completions/chatcmpl-x", headers={"X-Admin-Key": "guess-123"})
    assert reply.status_code == 403
    assert "guess-123" not in reply.text


@pytest.mark.parametrize(
    "headers",
    [{"Authorization": f"Bearer {ADMIN_KEY}"}, {"X-Admin-Key": ADMIN_KEY}],
    ids=["bearer", "x-admin-key"],
)
def test_right_key_reaches_the_route(http, headers):
    reply = http.get("/admin/completions/chatcmpl-missing", headers=headers)
    assert reply.status_code == 404
    assert reply.json()["error"]["code"] == "completion_not_found"


def test_healthz_reports_database_and_backend(http, vllm_url):
    body = http.get("/healthz").json()
    assert body["status"] == "ok"
    assert body["database"]["ok"] is True
    assert [b["url"] for b in body["backends"] if b["reachable"]] == [vllm_url]
