"""Every completion belongs to a session: named by URL, by header, or an implicit one of its own."""

from __future__ import annotations

import uuid

import httpx
import openai

from conftest import MODEL_NAME, fetch_record

MESSAGES = [{"role": "user", "content": "hello"}]


def test_session_base_url_binds_the_completion(gateway_url, admin_http):
    session_id = f"s-{uuid.uuid4().hex}"
    client = openai.OpenAI(base_url=f"{gateway_url}/sessions/{session_id}/v1", api_key="unused")
    reply = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=4)
    assert fetch_record(admin_http, reply.id)["session_id"] == session_id


def test_session_header_binds_the_completion(gateway_url, admin_http):
    session_id = f"h-{uuid.uuid4().hex}"
    client = openai.OpenAI(
        base_url=f"{gateway_url}/v1", api_key="unused", default_headers={"X-Session-Id": session_id}
    )
    reply = client.completions.create(model=MODEL_NAME, prompt="abc", max_tokens=4)
    assert fetch_record(admin_http, reply.id)["session_id"] == session_id


def test_a_call_without_session_gets_its_own(gateway_url, admin_http):
    with httpx.Client(base_url=gateway_url, timeout=60) as http:
        reply = http.post(
            "/v1/chat/completions",
            json={"model": MODEL_NAME, "messages": MESSAGES, "max_tokens": 4},
        )
    completion_id = reply.json()["id"]
    record = fetch_record(admin_http, completion_id)
    assert reply.headers["X-Session-Id"] == record["session_id"]
    assert record["session_id"].endswith(completion_id)


def test_session_id_with_bad_characters_gets_400(gateway_url):
    with httpx.Client(base_url=gateway_url, timeout=60) as http:
        reply = http.post(
            "/v1/chat/completions",
            headers={"X-Session-Id": "bad id/..;"},
            json={"model": MODEL_NAME, "messages": MESSAGES, "max_tokens": 4},
        )
    assert reply.status_code == 400
    assert reply.json()["error"]["code"] == "invalid_session_id"
