"""Agent keys, tenants and session tokens, with auth on (a real Postgres, a fake vLLM upstream).

Negative cases first: missing, wrong and default keys; another tenant's session (read, reward,
close, export, complete: all 404, exactly as for a session that does not exist); expired and
tampered session tokens; then what a key and a token may do."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import httpx
import openai
import pytest
from sqlalchemy import create_engine, text

from gateway.auth import TOKEN_AUDIENCE, TOKEN_ISSUER, JsonWebToken
from gateway.main import create_app

from auth_helpers import CHAT, TOKEN_SECRET, as_key, auth_gateway, mint_key
from conftest import ADMIN_KEY, LiveServer, free_port, gateway_settings
from fakes import FAKE_MODEL, fake_backend_database


@pytest.fixture(scope="module")
def db_url(make_database: Callable[[], str]) -> str:
    return fake_backend_database(make_database)


@pytest.fixture(scope="module")
def gw(db_url: str) -> Iterator[str]:
    with auth_gateway(db_url) as url:
        yield url


@pytest.fixture(scope="module")
def admin(gw: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gw, timeout=30, headers={"X-Admin-Key": ADMIN_KEY}) as client:
        yield client


@pytest.fixture(scope="module")
def alice(gw: str, admin: httpx.Client) -> Iterator[httpx.Client]:
    with as_key(gw, mint_key(admin, "alice")["key"]) as client:
        yield client


@pytest.fixture(scope="module")
def bob(gw: str, admin: httpx.Client) -> Iterator[httpx.Client]:
    with as_key(gw, mint_key(admin, "bob")["key"]) as client:
        yield client


def new_session(client: httpx.Client, **body) -> dict:
    reply = client.post("/v1/sessions", json=body)
    assert reply.status_code == 201, reply.text
    return reply.json()


def complete_in(client: httpx.Client, session_id: str) -> dict:
    reply = client.post(f"/sessions/{session_id}/v1/chat/completions", json=CHAT)
    assert reply.status_code == 200, reply.text
    return reply.json()


# ----------------------------------------------------------------------------- missing / wrong


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/v1/chat/completions", CHAT),
        ("POST", "/v1/completions", {"model": FAKE_MODEL, "prompt": "hi"}),
        ("POST", "/sessions/s1/v1/chat/completions", CHAT),
        ("GET", "/v1/models", None),
        ("POST", "/v1/sessions", {}),
        ("GET", "/v1/sessions/s1", None),
        ("POST", "/v1/sessions/s1/rewards", {"value": 1.0}),
        ("POST", "/v1/sessions/s1/close", None),
        ("GET", "/v1/sessions/s1/trajectory", None),
        ("POST", "/v1/sessions/s1/token", {}),
    ],
)
def test_agent_routes_need_a_credential(gw, method, path, body):
    with httpx.Client(base_url=gw, timeout=30) as anonymous:
        reply = anonymous.request(method, path, json=body)
        assert reply.status_code == 401, reply.text
        assert reply.json()["error"]["type"] == "authentication_error"
        assert reply.headers["WWW-Authenticate"] == "Bearer"
        # An invalid body still gets 401 first: nothing is validated for an unknown caller.
        assert anonymous.request(method, path, content=b"{not json").status_code == 401


@pytest.mark.parametrize(
    "credential",
    [
        "rlgw_ak_" + "A" * 43,  # well-formed, never minted
        "rlgw_ak_short",
        ADMIN_KEY,  # the admin key is not an agent credential
        "change-me",
        "a.b.c",
        "Basic dXNlcjpwYXNz",
    ],
)
def test_unknown_credentials_get_401_and_are_never_echoed(gw, credential):
    with as_key(gw, credential) as client:
        reply = client.post("/v1/chat/completions", json=CHAT)
    assert reply.status_code == 401
    assert credential not in reply.text


def test_admin_routes_refuse_agent_keys_and_default_keys(gw, admin):
    key = mint_key(admin, "carol")["key"]
    with as_key(gw, key) as client:
        assert client.get("/admin/agent_keys").status_code == 403
    with httpx.Client(base_url=gw, timeout=30) as anonymous:
        assert anonymous.get("/admin/agent_keys").status_code == 401
        reply = anonymous.get("/admin/agent_keys", headers={"X-Admin-Key": "change-me"})
        assert reply.status_code == 403
        assert "change-me" not in reply.text
        reply = anonymous.post(
            "/register_model", json={"name": "m", "backends": ["http://127.0.0.1:1"]}
        )
        assert reply.status_code == 401


# ----------------------------------------------------------------------------- admin key API


def test_a_key_is_shown_once_and_listed_without_secrets(admin, db_url):
    minted = mint_key(admin, "dave", "ci runner")
    assert minted["key"].startswith("rlgw_ak_") and minted["hint"] == minted["key"][:12]
    listed = admin.get("/admin/agent_keys", params={"tenant": "dave"}).json()
    assert [k["id"] for k in listed] == [minted["id"]]
    assert "key" not in listed[0] and minted["key"] not in admin.get("/admin/agent_keys").text
    engine = create_engine(db_url)
    with engine.connect() as conn:
        stored = conn.execute(
            text("SELECT key_hash FROM agent_keys WHERE id = :id"), {"id": minted["id"]}
        ).scalar_one()
    engine.dispose()
    assert minted["key"] not in stored and len(stored) == 64


def test_a_revoked_key_stops_working_at_once(gw, admin):
    minted = mint_key(admin, "erin")
    with as_key(gw, minted["key"]) as client:
        assert client.get("/v1/models").status_code == 200  # cached as valid now
        reply = admin.delete(f"/admin/agent_keys/{minted['id']}")
        assert reply.status_code == 200 and reply.json()["revoked_at"]
        assert client.get("/v1/models").status_code == 401
    assert admin.delete("/admin/agent_keys/ak_" + "0" * 24).status_code == 404
    assert admin.delete("/admin/agent_keys/not-an-id").status_code == 422


@pytest.mark.parametrize("tenant", ["", "-x", "a" * 65, "with space", "x/y"])
def test_invalid_tenants_are_refused(admin, tenant):
    assert admin.post("/admin/agent_keys", json={"tenant": tenant}).status_code == 422


# ----------------------------------------------------------------------------- tenants


def test_another_tenants_session_is_missing_for_every_operation(alice, bob, gw):
    owned = new_session(alice)["id"]
    done = complete_in(alice, owned)
    absent = "sess-does-not-exist"

    def attempts(session_id: str) -> list[httpx.Response]:
        return [
            bob.get(f"/v1/sessions/{session_id}"),
            bob.post(f"/v1/sessions/{session_id}/rewards", json={"value": 1.0}),
            bob.post(
                f"/v1/sessions/{session_id}/rewards",
                json={"value": 1.0, "completion_id": done["id"]},
            ),
            bob.post(f"/v1/sessions/{session_id}/close"),
            bob.get(f"/v1/sessions/{session_id}/trajectory"),
            bob.post(f"/v1/sessions/{session_id}/token", json={}),
        ]

    for theirs, missing in zip(attempts(owned), attempts(absent), strict=True):
        assert theirs.status_code == missing.status_code == 404, theirs.text
        assert theirs.json() == {
            "error": {**missing.json()["error"], "message": f"no session {owned}"}
        }
    # Completions: a session that does not exist would be created on first use; another
    # tenant's is reported missing, in the same words.
    for reply in (
        bob.post(f"/sessions/{owned}/v1/chat/completions", json=CHAT),
        bob.post(
            "/v1/completions",
            json={"model": FAKE_MODEL, "prompt": "x"},
            headers={"X-Session-Id": owned},
        ),
        bob.post(
            "/v1/chat/completions", json={**CHAT, "stream": True}, headers={"X-Session-Id": owned}
        ),
    ):
        assert reply.status_code == 404, reply.text
        assert reply.json()["error"] == {
            "message": f"no session {owned}",
            "type": "not_found_error",
            "param": None,
            "code": "session_not_found",
        }
    # Nothing of alice's changed: still open, one completion, no reward.
    detail = alice.get(f"/v1/sessions/{owned}").json()
    assert detail["status"] == "open"
    assert [c["id"] for c in detail["completions"]] == [done["id"]]
    assert detail["rewards"] == []


def count_completions(db_url: str, session_id: str | None = None) -> int:
    engine = create_engine(db_url)
    with engine.connect() as conn:
        if session_id is None:
            count = conn.execute(text("SELECT count(*) FROM completions")).scalar_one()
        else:
            count = conn.execute(
                text("SELECT count(*) FROM completions WHERE session_id = :s"), {"s": session_id}
            ).scalar_one()
    engine.dispose()
    return count


def test_another_tenants_session_is_missing_on_the_responses_and_messages_apis(
    alice, bob, gw, db_url
):
    """The Responses and Messages APIs answer for another tenant's session exactly as chat does
    (404 session_not_found, in the envelope of their own API), on the per-session base URL and
    with X-Session-Id, streamed or not, and record nothing anywhere."""
    owned = new_session(alice)["id"]
    done = complete_in(alice, owned)
    total = count_completions(db_url)
    responses = {"model": FAKE_MODEL, "input": "hi", "max_output_tokens": 4}
    messages = {
        "model": FAKE_MODEL,
        "max_tokens": 4,
        "messages": [{"role": "user", "content": "hi"}],
    }
    bobs_key = bob.headers["Authorization"].removeprefix("Bearer ")
    in_header = {"X-Session-Id": owned}

    openai_replies = [
        bob.post(f"/sessions/{owned}/v1/responses", json=responses),
        bob.post(f"/sessions/{owned}/v1/responses", json={**responses, "stream": True}),
        bob.post("/v1/responses", json=responses, headers=in_header),
        bob.post("/v1/responses", json={**responses, "stream": True}, headers=in_header),
    ]
    for reply in openai_replies:
        assert reply.status_code == 404, reply.text
        assert reply.headers["content-type"].startswith("application/json")
        assert reply.json() == {
            "error": {
                "message": f"no session {owned}",
                "type": "not_found_error",
                "param": None,
                "code": "session_not_found",
            }
        }

    with httpx.Client(base_url=gw, timeout=30, headers={"x-api-key": bobs_key}) as bob_x_api_key:
        anthropic_replies = [
            bob.post(f"/sessions/{owned}/v1/messages", json=messages),
            bob.post(f"/sessions/{owned}/v1/messages", json={**messages, "stream": True}),
            bob.post("/v1/messages", json=messages, headers=in_header),
            bob.post("/v1/messages", json={**messages, "stream": True}, headers=in_header),
            # The Messages API's own header for the key: the same answer.
            bob_x_api_key.post(f"/sessions/{owned}/v1/messages", json=messages),
            bob_x_api_key.post("/v1/messages", json=messages, headers=in_header),
        ]
    for reply in anthropic_replies:
        assert reply.status_code == 404, reply.text
        assert reply.headers["content-type"].startswith("application/json")
        assert reply.json() == {
            "type": "error",
            "error": {"type": "not_found_error", "message": f"no session {owned}"},
        }

    # A session that does not exist is created on first use by the same calls: bob's own key
    # works on these routes, only alice's session is out of reach.
    mine = f"bob-own-{time.time_ns()}"
    assert bob.post(f"/sessions/{mine}/v1/responses", json=responses).status_code == 200
    assert bob.post(f"/sessions/{mine}/v1/messages", json=messages).status_code == 200
    assert count_completions(db_url, mine) == 2
    # Nothing was recorded in alice's session, nor anywhere else for the refused calls.
    assert count_completions(db_url, owned) == 1
    assert count_completions(db_url) == total + 2
    detail = alice.get(f"/v1/sessions/{owned}").json()
    assert detail["status"] == "open"
    assert [c["id"] for c in detail["completions"]] == [done["id"]]


def test_sessions_take_the_tenant_of_their_key(alice, db_url):
    explicit = new_session(alice)["id"]
    first_use = "first-use-" + str(time.time_ns())
    complete_in(alice, first_use)
    implicit = alice.post("/v1/chat/completions", json=CHAT).headers["X-Session-Id"]
    engine = create_engine(db_url)
    with engine.connect() as conn:
        rows = dict(
            conn.execute(
                text("SELECT id, tenant FROM sessions WHERE id IN (:a, :b, :c)"),
                {"a": explicit, "b": first_use, "c": implicit},
            ).all()
        )
    engine.dispose()
    assert rows == {explicit: "alice", first_use: "alice", implicit: "alice"}


def test_a_group_of_another_tenant_cannot_be_joined(alice, bob):
    group = f"grp-{time.time_ns()}"
    new_session(alice, group_id=group, group_size=2)
    reply = bob.post("/v1/sessions", json={"group_id": group})
    assert reply.status_code == 409 and reply.json()["error"]["code"] == "group_unavailable"
    new_session(alice, group_id=group)


def test_an_id_taken_by_another_tenant_is_a_conflict_without_details(alice, bob):
    sid = f"taken-{time.time_ns()}"
    new_session(alice, id=sid, metadata={"secret": "alice-only"})
    reply = bob.post("/v1/sessions", json={"id": sid})
    assert reply.status_code == 409 and "alice-only" not in reply.text


# ----------------------------------------------------------------------------- session tokens


def mint_token(client: httpx.Client, session_id: str, **body) -> dict:
    reply = client.post(f"/v1/sessions/{session_id}/token", json=body)
    assert reply.status_code == 201, reply.text
    return reply.json()


def test_a_token_reaches_its_own_session_only(alice, gw):
    mine, other = new_session(alice)["id"], new_session(alice)["id"]
    minted = mint_token(alice, mine, ttl_s=600)
    assert minted["base_url"].endswith(f"/sessions/{mine}/v1")
    assert minted["scopes"] == ["completions", "read"]
    with as_key(gw, minted["token"]) as agent:
        assert agent.post(f"/sessions/{mine}/v1/chat/completions", json=CHAT).status_code == 200
        # The plain base URL binds to the token's session, never to a new one.
        reply = agent.post("/v1/chat/completions", json=CHAT)
        assert reply.status_code == 200 and reply.headers["X-Session-Id"] == mine
        assert agent.get(f"/v1/sessions/{mine}").status_code == 200
        assert agent.get(f"/v1/sessions/{mine}/trajectory").status_code == 200
        assert agent.get("/v1/models").status_code == 200
        # Its own tenant's other session: as missing as any other.
        assert agent.get(f"/v1/sessions/{other}").status_code == 404
        assert agent.post(f"/sessions/{other}/v1/chat/completions", json=CHAT).status_code == 404
        reply = agent.post("/v1/chat/completions", json=CHAT, headers={"X-Session-Id": other})
        assert reply.status_code == 404
        # Routes that are not about its session: forbidden.
        assert agent.post("/v1/sessions", json={}).status_code == 403
        assert agent.post(f"/v1/sessions/{mine}/token", json={}).status_code == 403
        # Not granted by default: the agent cannot reward or close its own episode.
        reply = agent.post(f"/v1/sessions/{mine}/rewards", json={"value": 1e9})
        assert reply.status_code == 403 and reply.json()["error"]["code"] == "scope_not_granted"
        assert agent.post(f"/v1/sessions/{mine}/close").status_code == 403
    assert len(alice.get(f"/v1/sessions/{mine}").json()["completions"]) == 2


def test_granted_scopes_and_the_openai_client(alice, gw):
    sid = new_session(alice)["id"]
    minted = mint_token(alice, sid, scopes=["completions", "rewards", "close"])
    client = openai.OpenAI(base_url=minted["base_url"], api_key=minted["token"], max_retries=0)
    reply = client.chat.completions.create(**CHAT)
    with as_key(gw, minted["token"]) as agent:
        assert agent.post(f"/v1/sessions/{sid}/rewards", json={"value": 1.0}).status_code == 201
        assert agent.get(f"/v1/sessions/{sid}").status_code == 403  # read not granted
        assert agent.post(f"/v1/sessions/{sid}/close").status_code == 200
    detail = alice.get(f"/v1/sessions/{sid}").json()
    assert detail["status"] == "closed" and detail["completions"][0]["id"] == reply.id


def forge(claims: dict, secret: str = TOKEN_SECRET, alg: str = "HS256") -> str:
    return JsonWebToken([alg]).encode({"alg": alg}, claims, secret).decode()


def test_expired_tampered_and_forged_tokens_get_401(alice, gw, admin):
    sid = new_session(alice)["id"]
    good = mint_token(alice, sid, ttl_s=60)["token"]
    key_id = admin.get("/admin/agent_keys", params={"tenant": "alice"}).json()[0]["id"]
    now = int(time.time())
    base = {
        "iss": TOKEN_ISSUER,
        "aud": TOKEN_AUDIENCE,
        "sub": sid,
        "ten": "alice",
        "kid": key_id,
        "scp": ["completions", "read"],
        "iat": now,
        "exp": now + 60,
    }
    header, payload, signature = good.split(".")
    flipped = signature[:-2] + ("AA" if signature[-2:] != "AA" else "BB")
    other_payload = forge({**base, "sub": "someone-else"}).split(".")[1]
    bad = {
        "expired": forge({**base, "iat": now - 120, "exp": now - 60}),
        "tampered signature": f"{header}.{payload}.{flipped}",
        "payload swapped": f"{header}.{other_payload}.{signature}",
        "wrong secret": forge(base, secret="another-secret-0123456789-abcdefghijkl"),
        "alg none": f"eyJhbGciOiJub25lIn0.{payload}.",
        "no expiry": forge({k: v for k, v in base.items() if k != "exp"}),
        "wrong audience": forge({**base, "aud": "someone"}),
        "unknown scope": forge({**base, "scp": ["admin"]}),
        "tenant mismatch": forge({**base, "ten": "bob"}),
    }
    with as_key(gw, good) as agent:
        assert agent.get(f"/v1/sessions/{sid}").status_code == 200
    for label, token in bad.items():
        with as_key(gw, token) as agent:
            reply = agent.get(f"/v1/sessions/{sid}")
            assert reply.status_code == 401, label
    with as_key(gw, bad["expired"]) as agent:
        assert agent.get(f"/v1/sessions/{sid}").json()["error"]["code"] == "token_expired"


def test_a_token_dies_with_its_key(gw, admin):
    minted_key = mint_key(admin, "frank")
    with as_key(gw, minted_key["key"]) as harness:
        sid = new_session(harness)["id"]
        token = mint_token(harness, sid)["token"]
    admin.delete(f"/admin/agent_keys/{minted_key['id']}")
    with as_key(gw, token) as agent:
        reply = agent.get(f"/v1/sessions/{sid}")
    assert reply.status_code == 401 and reply.json()["error"]["code"] == "key_revoked"


def test_token_ttl_is_bounded(alice):
    sid = new_session(alice)["id"]
    assert alice.post(f"/v1/sessions/{sid}/token", json={"ttl_s": 0}).status_code == 422
    reply = alice.post(f"/v1/sessions/{sid}/token", json={"ttl_s": 10**9})
    assert reply.status_code == 400 and reply.json()["error"]["code"] == "ttl_too_long"
    assert alice.post(f"/v1/sessions/{sid}/token", json={"scopes": ["root"]}).status_code == 422


def test_tokens_are_refused_with_auth_off(db_url):
    settings = gateway_settings(db_url)
    with (
        LiveServer(create_app(settings), free_port()) as live,
        httpx.Client(base_url=live.url, timeout=30) as client,
    ):
        sid = new_session(client)["id"]
        reply = client.post(f"/v1/sessions/{sid}/token", json={})
    assert reply.status_code == 400 and reply.json()["error"]["code"] == "auth_disabled"


def test_healthz_hides_backend_addresses_without_the_admin_key(gw):
    with httpx.Client(base_url=gw, timeout=30) as anonymous:
        body = anonymous.get("/healthz").json()
        assert body["backends"] and all("url" not in b for b in body["backends"])
        detailed = anonymous.get("/healthz", headers={"X-Admin-Key": ADMIN_KEY}).json()
        assert [b["url"] for b in detailed["backends"]] == ["http://fake-backend.invalid"]
