"""Streams that do not finish leave records marked incomplete, never records that look complete."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from conftest import MODEL_NAME, fetch_record


def _first_chunk_id(response: httpx.Response) -> str:
    for line in response.iter_lines():
        if line.startswith("data:") and line[5:].strip() != "[DONE]":
            return json.loads(line[5:])["id"]
    raise AssertionError("no chunk before the stream ended")


LONG_STREAM = {
    "model": MODEL_NAME,
    "messages": [{"role": "user", "content": "Talk for a long time."}],
    # Long enough that the stream does not end before the gateway sees the hang-up, even on a busy
    # machine: the relay writes up to 32 events of one read at once, so 480 tokens were once all
    # sent before the disconnect was seen (the record came back complete). The tiny model has
    # 2048 positions.
    "max_tokens": 1500,
    "ignore_eos": True,  # vLLM extension: make the stream long enough to walk away from
    "stream": True,
}


def _hang_up_after_first_chunk(url: str, headers: dict[str, str] | None = None) -> str:
    """Start a long stream, read one chunk, disconnect; the completion id of the stream."""
    with (
        httpx.Client(timeout=60) as http,
        http.stream("POST", url, json=LONG_STREAM, headers=headers or {}) as response,
    ):
        assert response.status_code == 200
        return _first_chunk_id(response)


def test_client_disconnect_mid_stream_is_recorded_incomplete(gateway_url, admin_http):
    completion_id = _hang_up_after_first_chunk(f"{gateway_url}/v1/chat/completions")
    # The client has hung up after the first chunk.
    record = fetch_record(admin_http, completion_id)
    assert record["status"] == "incomplete"
    assert "disconnect" in record["status_reason"]
    assert record["eligible"] is False
    assert record["finish_reason"] is None
    assert len(record["output_token_ids"]) < LONG_STREAM["max_tokens"]


@pytest.mark.parametrize("binding", ["base_url", "x_session_id"])
def test_disconnect_in_a_named_session_is_exported_as_not_eligible(
    gateway_url, admin_http, binding
):
    """The trajectory export keeps every non-orphan completion as a step (rlgw/trajectory.py:
    only retry orphans go under `excluded`), so the cut one is there, marked not eligible."""
    with httpx.Client(base_url=gateway_url, timeout=60) as http:
        created = http.post("/v1/sessions", json={"task_id": f"hang-up-{binding}"})
        assert created.status_code == 201, created.text
        session = created.json()
        sid = session["id"]
        if binding == "base_url":
            completion_id = _hang_up_after_first_chunk(f"{session['base_url']}/chat/completions")
        else:
            completion_id = _hang_up_after_first_chunk(
                f"{gateway_url}/v1/chat/completions", headers={"X-Session-Id": sid}
            )
        record = fetch_record(admin_http, completion_id)  # waits for the write after the hang-up
        assert record["session_id"] == sid
        assert record["status"] == "incomplete" and "disconnect" in record["status_reason"]

        (summary,) = http.get(f"/v1/sessions/{sid}").json()["completions"]
        assert summary["id"] == completion_id
        assert summary["status"] == "incomplete"
        assert summary["eligible"] is False and "incomplete" in summary["eligibility_reason"]
        assert summary["finish_reason"] is None and summary["is_orphan"] is False

        trajectory = http.get(f"/v1/sessions/{sid}/trajectory")
        assert trajectory.status_code == 200, trajectory.text
        trajectory = trajectory.json()
        assert trajectory["excluded"] == []  # not a retry orphan
        (step,) = trajectory["steps"]
        assert step["completion_id"] == completion_id
        assert step["eligible"] is False
        assert step["eligibility_reason"] == summary["eligibility_reason"]
        assert step["finish_reason"] is None
        # What was streamed before the hang-up is stored, and it is cut short.
        assert step["output_token_ids"] == record["output_token_ids"]
        assert len(step["output_token_ids"]) < LONG_STREAM["max_tokens"]


def test_the_disconnected_backend_slot_is_released(gateway_url, admin_http):
    deadline = time.monotonic() + 60  # ends as soon as it is released
    while time.monotonic() < deadline:
        health = admin_http.get("/healthz").json()
        if all(b["in_flight"] == 0 for b in health["backends"]):
            return
        time.sleep(0.2)
    raise AssertionError(f"in-flight count not released: {health['backends']}")
