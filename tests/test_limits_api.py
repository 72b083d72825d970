"""Request limits through the HTTP surface: body size, max_tokens cap, n, per-key rate and
concurrency (429 with Retry-After). Auth on, real Postgres, fake vLLM upstream."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

import httpx
import pytest
from sqlalchemy import create_engine, text

from auth_helpers import CHAT, as_key, auth_gateway, mint_key
from conftest import ADMIN_KEY
from fakes import FAKE_MODEL, fake_backend_database


@pytest.fixture(scope="module")
def db_url(make_database: Callable[[], str]) -> str:
    return fake_backend_database(make_database)


def key_for(gw: str, tenant: str) -> str:
    with httpx.Client(base_url=gw, timeout=30, headers={"X-Admin-Key": ADMIN_KEY}) as admin:
        return mint_key(admin, tenant)["key"]


def test_oversize_bodies_get_413_before_anything_else(db_url):
    with auth_gateway(db_url, max_body_bytes=2048) as gw, as_key(gw, key_for(gw, "t")) as c:
        big = {**CHAT, "messages": [{"role": "user", "content": "x" * 4096}]}
        reply = c.post("/v1/chat/completions", json=big)
        assert reply.status_code == 413 and reply.json()["error"]["code"] == "body_too_large"
        # Also without a Content-Length (chunked), and without any credential.
        chunks = iter([json.dumps(big).encode()[i : i + 512] for i in range(0, 5000, 512)])
        reply = c.post("/v1/chat/completions", content=chunks)
        assert reply.status_code == 413
        with httpx.Client(base_url=gw, timeout=30) as anonymous:
            assert anonymous.post("/v1/chat/completions", json=big).status_code == 413


def test_max_tokens_and_n_caps(db_url):
    with auth_gateway(db_url, max_tokens_cap=64) as gw, as_key(gw, key_for(gw, "t")) as c:
        for path, body in (
            ("/v1/chat/completions", CHAT),
            ("/v1/completions", {"model": FAKE_MODEL, "prompt": "hi"}),
        ):
            for field in ("max_tokens", "max_completion_tokens"):
                reply = c.post(path, json={**body, field: 65})
                assert reply.status_code == 400, reply.text
                error = reply.json()["error"]
                assert (error["code"], error["param"]) == ("max_tokens_too_large", field)
                assert c.post(path, json={**body, field: 64}).status_code == 200
            for bad in (0, -1, "64", 1.5, 10**30):
                assert c.post(path, json={**body, "max_tokens": bad}).status_code == 400
            reply = c.post(path, json={**body, "n": 17})  # RLGW_MAX_N (16)
            assert reply.status_code == 400 and reply.json()["error"]["code"] == "n_too_large"


def completions_of(db_url: str, tenant: str) -> int:
    engine = create_engine(db_url)
    with engine.connect() as conn:
        count = conn.execute(
            text(
                "SELECT count(*) FROM completions c JOIN sessions s ON s.id = c.session_id"
                " WHERE s.tenant = :t"
            ),
            {"t": tenant},
        ).scalar_one()
    engine.dispose()
    return count


def test_token_caps_of_the_responses_and_messages_apis(db_url):
    """max_output_tokens (Responses) and max_tokens (Messages) are held to RLGW_MAX_TOKENS_CAP,
    refused with a 400 in the envelope of each API, on both base URLs, before anything is
    recorded. Neither API has `n`: an `n` there is ignored (one output, one record), never a
    way past RLGW_MAX_N."""
    responses = {"model": FAKE_MODEL, "input": "hi"}
    messages = {"model": FAKE_MODEL, "messages": [{"role": "user", "content": "hi"}]}
    with auth_gateway(db_url, max_tokens_cap=64) as gw, as_key(gw, key_for(gw, "caps")) as c:
        sid = c.post("/v1/sessions", json={}).json()["id"]
        before = completions_of(db_url, "caps")
        for path in ("/v1/responses", f"/sessions/{sid}/v1/responses"):
            for stream in (False, True):
                body = {**responses, "max_output_tokens": 65, "stream": stream}
                reply = c.post(path, json=body)
                assert reply.status_code == 400, reply.text
                assert reply.json() == {
                    "error": {
                        "message": "max_output_tokens 65 exceeds this gateway's cap of 64 "
                        "(RLGW_MAX_TOKENS_CAP)",
                        "type": "invalid_request_error",
                        "param": "max_output_tokens",
                        "code": "max_tokens_too_large",
                    }
                }
            for bad in (0, -1, "64", 1.5, 10**30):
                reply = c.post(path, json={**responses, "max_output_tokens": bad})
                assert reply.status_code == 400, reply.text
                assert reply.json()["error"]["type"] == "invalid_request_error"
        for path in ("/v1/messages", f"/sessions/{sid}/v1/messages"):
            for stream in (False, True):
                reply = c.post(path, json={**messages, "max_tokens": 65, "stream": stream})
                assert reply.status_code == 400, reply.text
                assert reply.json() == {
                    "type": "error",
                    "error": {
                        "type": "invalid_request_error",
                        "message": "max_tokens 65 exceeds this gateway's cap of 64 "
                        "(RLGW_MAX_TOKENS_CAP)",
                    },
                }
            for bad in (0, -1, "64", 1.5, 10**30):
                reply = c.post(path, json={**messages, "max_tokens": bad})
                assert reply.status_code == 400, reply.text
                body = reply.json()
                assert body["type"] == "error", body
                assert body["error"]["type"] == "invalid_request_error"
        assert completions_of(db_url, "caps") == before  # nothing refused was recorded
        assert c.get(f"/v1/sessions/{sid}").json()["completions"] == []

        # At the cap: served and recorded.
        reply = c.post("/v1/responses", json={**responses, "max_output_tokens": 64})
        assert reply.status_code == 200, reply.text
        reply = c.post("/v1/messages", json={**messages, "max_tokens": 64})
        assert reply.status_code == 200, reply.text
        assert completions_of(db_url, "caps") == before + 2
        # `n` above RLGW_MAX_N (16): not part of either API, so not passed to the backend.
        for path, body in (
            (f"/sessions/{sid}/v1/responses", {**responses, "max_output_tokens": 4, "n": 17}),
            (f"/sessions/{sid}/v1/messages", {**messages, "max_tokens": 4, "n": 17}),
        ):
            assert c.post(path, json=body).status_code == 200
        recorded = c.get(f"/v1/sessions/{sid}").json()["completions"]
        assert len(recorded) == 2
        with httpx.Client(base_url=gw, timeout=30, headers={"X-Admin-Key": ADMIN_KEY}) as admin:
            for completion in recorded:
                record = admin.get(f"/admin/completions/{completion['id']}").json()
                assert record["request"]["n"] == 17  # the client's body, as sent
                assert "n" not in record["backend_request"]  # what the backend was asked
                assert record["sibling_group"] is None


def test_rate_limit_per_key_answers_429_with_retry_after(db_url):
    with (
        auth_gateway(db_url, rate_limit_rps=0.2, rate_limit_burst=3) as gw,
        as_key(gw, key_for(gw, "a")) as a,
        as_key(gw, key_for(gw, "b")) as b,
    ):
        assert [a.get("/v1/models").status_code for _ in range(3)] == [200] * 3
        reply = a.get("/v1/models")
        assert reply.status_code == 429
        assert reply.json()["error"]["code"] == "rate_limited"
        assert int(reply.headers["Retry-After"]) >= 1
        # Every route of the key counts, the session API included; other keys do not.
        assert a.post("/v1/sessions", json={}).status_code == 429
        assert b.get("/v1/models").status_code == 200
        # A session token spends its minting key's bucket.
        sid = b.post("/v1/sessions", json={}).json()["id"]
        token = b.post(f"/v1/sessions/{sid}/token", json={}).json()["token"]
        with as_key(gw, token) as agent:
            assert agent.get(f"/v1/sessions/{sid}").status_code == 429


def test_concurrency_limit_per_key_holds_the_slot_until_the_answer_is_sent(db_url):
    with auth_gateway(db_url, delay_s=1.0, stream_gap_s=1.5, max_concurrency_per_key=1) as gw:
        key, other = key_for(gw, "a"), key_for(gw, "b")
        first: dict = {}

        def slow(body: dict) -> None:
            with as_key(gw, key) as c:
                first["reply"] = c.post("/v1/chat/completions", json=body)

        # Upstream answers after 1 s; a stream then sends its second chunk 1.5 s later.
        for body, wait_s in ((CHAT, 0.5), ({**CHAT, "stream": True}, 1.5)):
            worker = threading.Thread(target=slow, args=(body,))
            worker.start()
            time.sleep(wait_s)  # waiting on the upstream (plain) or in mid-stream (stream)
            with as_key(gw, key) as c, as_key(gw, other) as o:
                reply = c.post("/v1/chat/completions", json=CHAT)
                assert reply.status_code == 429, reply.text
                assert reply.json()["error"]["code"] == "too_many_concurrent_requests"
                assert reply.headers["Retry-After"] == "1"
                assert o.get("/v1/models").status_code == 200
            worker.join()
            assert first["reply"].status_code == 200
            with as_key(gw, key) as c:
                assert c.get("/v1/models").status_code == 200  # the slot came back
