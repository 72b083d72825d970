"""The generation routes' fast lanes (gateway/fast_lane.py) serve the requests their routes would
accept, and answer exactly as the routes do: the same request to a gateway with lanes and to one
without gets the same status and the same body (the same error envelope, field for field), and
every request a lane does not take reaches its route unchanged."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest

from gateway.main import create_app

from auth_helpers import TOKEN_SECRET, mint_key
from conftest import ADMIN_KEY, LiveServer, fetch_record, free_port, gateway_settings
from fakes import FAKE_MODEL, fake_backend_database, vllm_like

CHAT = {"model": FAKE_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
TEXT = {"model": FAKE_MODEL, "prompt": "hi", "max_tokens": 4}
RESPONSE = {"model": FAKE_MODEL, "input": "hi", "max_output_tokens": 4}
MESSAGE = {"model": FAKE_MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def database(make_database: Callable[[], str]) -> str:
    return fake_backend_database(make_database)


class Gateway:
    def __init__(self, database: str, fast_lanes: bool, **settings: Any) -> None:
        self.app = create_app(
            gateway_settings(database, **settings),
            upstream_transport=httpx.MockTransport(vllm_like()),
            fast_lanes=fast_lanes,
        )
        self.server = LiveServer(self.app, free_port()).__enter__()
        self.url = self.server.url

    def counts(self) -> tuple[int, int]:
        lanes = self.app.state.fast_lanes
        return lanes.served, lanes.handed_on


@pytest.fixture(scope="module")
def gateways(database: str) -> Iterator[tuple[Gateway, Gateway]]:
    pair = Gateway(database, fast_lanes=True), Gateway(database, fast_lanes=False)
    yield pair
    for gateway in pair:
        gateway.server.__exit__(None, None, None)


def _post(url: str, path: str, content: bytes, headers: dict[str, str]) -> httpx.Response:
    with httpx.Client(base_url=url, timeout=30) as http:
        return http.post(path, content=content, headers=headers)


def _shape(reply: httpx.Response) -> Any:
    """What must match between the two gateways: an error's whole body; for an answer, its
    fields and its text (ids and timestamps differ by nature)."""
    if reply.status_code != 200:
        return reply.json()
    if reply.headers["content-type"].startswith("text/event-stream"):
        return [line.split(b":", 1)[0] for line in reply.content.splitlines() if line]
    body = reply.json()
    text = json.dumps(body.get("choices") or body.get("content") or body["output"])
    return sorted(body), _ID.sub('"<id>"', text)


_ID = re.compile(r'"(chatcmpl|cmpl|resp|msg|rs|fc|call)[-_][0-9A-Za-z_-]+"')
JSON = {"content-type": "application/json"}
LONG_KEY = {**JSON, "Idempotency-Key": "k" * 257}

# (name, path, raw body, headers, whether the lane serves it itself)
CASES = [
    ("chat", "/v1/chat/completions", json.dumps(CHAT).encode(), JSON, True),
    ("chat-stream", "/v1/chat/completions", json.dumps(CHAT | {"stream": True}), JSON, True),
    ("chat-no-content-type", "/v1/chat/completions", json.dumps(CHAT), {}, False),
    (
        "chat-charset",
        "/v1/chat/completions",
        json.dumps(CHAT),
        {"content-type": "application/json; charset=utf-8"},
        True,
    ),
    ("chat-in-session", "/sessions/lane-s1/v1/chat/completions", json.dumps(CHAT), JSON, True),
    (
        "chat-header-session",
        "/v1/chat/completions",
        json.dumps(CHAT),
        {**JSON, "X-Session-Id": "lane-s2", "Idempotency-Key": "k1"},
        True,
    ),
    ("text", "/v1/completions", json.dumps(TEXT), JSON, True),
    ("text-in-session", "/sessions/lane-s3/v1/completions", json.dumps(TEXT), JSON, True),
    ("responses", "/v1/responses", json.dumps(RESPONSE), JSON, True),
    ("messages", "/v1/messages", json.dumps(MESSAGE), JSON, True),
    # Accepted by the body model, refused by the handler: the lane's own error, the app's
    # handler's envelope.
    (
        "over-the-token-cap",
        "/v1/chat/completions",
        json.dumps(CHAT | {"max_tokens": 10**6}),
        JSON,
        True,
    ),
    (
        "messages-over-the-cap",
        "/v1/messages",
        json.dumps(MESSAGE | {"max_tokens": 10**6}),
        JSON,
        True,
    ),
    # Everything else is the route's.
    ("no-messages", "/v1/chat/completions", json.dumps(CHAT | {"messages": []}), JSON, False),
    ("chat-echo", "/v1/chat/completions", json.dumps(CHAT | {"echo": True}), JSON, False),
    ("messages-invalid", "/v1/messages", json.dumps({"model": FAKE_MODEL}), JSON, False),
    ("nan", "/v1/chat/completions", json.dumps(CHAT | {"temperature": float("nan")}), JSON, False),
    (
        "integer-beyond-64-bits",
        "/v1/chat/completions",
        json.dumps(CHAT | {"max_tokens": 10**30}),
        JSON,
        False,
    ),
    ("not-an-object", "/v1/chat/completions", b"[1, 2]", JSON, False),
    ("not-json", "/v1/chat/completions", b"{'model': 1}", JSON, False),
    ("empty", "/v1/chat/completions", b"", JSON, False),
    ("text-plain", "/v1/chat/completions", json.dumps(CHAT), {"content-type": "text/plain"}, False),
    ("idempotency-key-too-long", "/v1/chat/completions", json.dumps(CHAT), LONG_KEY, False),
]


@pytest.mark.parametrize(
    "path, body, headers, served", [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_a_lane_answers_as_its_route_does(
    gateways, path: str, body: str | bytes, headers: dict[str, str], served: bool
):
    fast, plain = gateways
    content = body.encode() if isinstance(body, str) else body
    before = fast.counts()
    lane_reply = _post(fast.url, path, content, headers)
    assert fast.counts() == (before[0] + served, before[1] + (not served))
    route_reply = _post(plain.url, path, content, headers)
    assert lane_reply.status_code == route_reply.status_code
    assert _shape(lane_reply) == _shape(route_reply)
    assert ("x-completion-id" in lane_reply.headers) == ("x-completion-id" in route_reply.headers)


def test_what_a_lane_serves_is_recorded_as_the_route_records_it(gateways):
    fast, plain = gateways
    records = []
    for gateway in (fast, plain):
        client = openai.OpenAI(base_url=f"{gateway.url}/sessions/lane-rec/v1", api_key="unused")
        reply = client.chat.completions.with_raw_response.create(
            model=FAKE_MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        with httpx.Client(base_url=gateway.url, headers={"X-Admin-Key": ADMIN_KEY}) as admin:
            records.append(fetch_record(admin, reply.headers["X-Completion-Id"]))
    kept = ("status", "prompt_token_ids", "output_token_ids", "output_logprobs", "session_id")
    assert [{k: r[k] for k in kept} for r in records[:1]] == [
        {k: r[k] for k in kept} for r in records[1:]
    ]
    assert records[0]["status"] == "complete"


@pytest.fixture(scope="module")
def auth_gateways(database: str) -> Iterator[tuple[Gateway, Gateway, str]]:
    pair = [
        Gateway(database, fast_lanes=lanes, auth="on", token_secret=TOKEN_SECRET)
        for lanes in (True, False)
    ]
    with httpx.Client(base_url=pair[0].url, headers={"X-Admin-Key": ADMIN_KEY}) as admin:
        key = mint_key(admin, "lane-tenant")["key"]
    yield pair[0], pair[1], key
    for gateway in pair:
        gateway.server.__exit__(None, None, None)


@pytest.mark.parametrize(
    "path, body, headers, status",
    [
        ("/v1/chat/completions", CHAT, {}, 401),
        ("/v1/chat/completions", CHAT, {"Authorization": "Basic abc"}, 401),
        ("/v1/chat/completions", CHAT, {"Authorization": "Bearer rlgw_ak_wrong"}, 401),
        ("/v1/chat/completions", CHAT, {"Authorization": "Bearer {key}"}, 200),
        ("/v1/chat/completions", CHAT, {"x-api-key": "{key}"}, 401),  # the Messages API's only
        ("/v1/messages", MESSAGE, {"x-api-key": "{key}"}, 200),
        ("/v1/messages", MESSAGE, {"x-api-key": ""}, 401),
        ("/v1/messages", MESSAGE, {"Authorization": "Bearer {key}", "x-api-key": "bad"}, 200),
        ("/sessions/lane-auth/v1/completions", TEXT, {"Authorization": "Bearer {key}"}, 200),
    ],
    ids=[
        "none",
        "not-bearer",
        "wrong-key",
        "key",
        "x-api-key-on-openai",
        "x-api-key",
        "empty-x-api-key",
        "bearer-wins",
        "session-path",
    ],
)
def test_a_lane_admits_callers_as_its_route_does(
    auth_gateways, path: str, body: dict, headers: dict[str, str], status: int
):
    fast, plain, key = auth_gateways
    headers = JSON | {name: value.format(key=key) for name, value in headers.items()}
    served_before = fast.counts()[0]
    replies = [_post(g.url, path, json.dumps(body).encode(), headers) for g in (fast, plain)]
    assert fast.counts()[0] == served_before + 1  # the body is valid: the lane admits the caller
    assert [r.status_code for r in replies] == [status, status]
    assert _shape(replies[0]) == _shape(replies[1])
    assert replies[0].headers.get("www-authenticate") == replies[1].headers.get("www-authenticate")
