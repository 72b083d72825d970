"""Streams that do not finish leave records marked incomplete, never records that look complete."""

from __future__ import annotations

import json
import time

import httpx

from conftest import MODEL_NAME, fetch_record


def _first_chunk_id(response: httpx.Response) -> str:
    for line in response.iter_lines():
        if line.startswith("data:") and line[5:].strip() != "[DONE]":
            return json.loads(line[5:])["id"]
    raise AssertionError("no chunk before the stream ended")


def test_client_disconnect_mid_stream_is_recorded_incomplete(gateway_url, admin_http):
    body = {
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": "Talk for a long time."}],
        "max_tokens": 480,
        "ignore_eos": True,  # vLLM extension: make the stream long enough to walk away from
        "stream": True,
    }
    with (
        httpx.Client(timeout=60) as http,
        http.stream("POST", f"{gateway_url}/v1/chat/completions", json=body) as response,
    ):
        assert response.status_code == 200
        completion_id = _first_chunk_id(response)
    # The client has hung up after the first chunk.
    record = fetch_record(admin_http, completion_id)
    assert record["status"] == "incomplete"
    assert "disconnect" in record["status_reason"]
    assert record["eligible"] is False
    assert record["finish_reason"] is None
    assert len(record["output_token_ids"]) < 480


def test_the_disconnected_backend_slot_is_released(gateway_url, admin_http):
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        health = admin_http.get("/healthz").json()
        if all(b["in_flight"] == 0 for b in health["backends"]):
            return
        time.sleep(0.2)
    raise AssertionError(f"in-flight count not released: {health['backends']}")
