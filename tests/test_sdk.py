"""rlgw_sdk against a live gateway (real vLLM, real Postgres), and its retry rule against faults."""

from __future__ import annotations

import json
import ssl
import uuid
from collections.abc import Callable

import httpx
import openai
import pytest

import rlgw_sdk
from rlgw_sdk import (
    AsyncGateway,
    BadRequestError,
    ConflictError,
    Gateway,
    GatewayConnectionError,
    NotFoundError,
    RateLimitError,
    ServerError,
)

from conftest import MODEL_NAME

MESSAGES = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def gateway(gateway_url: str):
    with Gateway(gateway_url, timeout=120) as gw:
        yield gw


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch):
    monkeypatch.setattr(rlgw_sdk._base, "RETRY_BASE_DELAY", 0.0)


def complete(session, **kwargs):
    client = session.openai(max_retries=0, timeout=120)
    return client.chat.completions.create(
        model=MODEL_NAME, messages=MESSAGES, max_tokens=4, **kwargs
    )


# ----------------------------------------------------------------------------- live gateway


def test_session_flow_records_a_completion_rewards_it_once_per_key_and_closes(gateway):
    session = gateway.create_session(task_id="sdk-flow", metadata={"k": 1})
    assert session.base_url.endswith(f"/sessions/{session.id}/v1")
    reply = complete(session)

    first = session.reward(1.0, completion_id=reply.id, idempotency_key="sdk-k1")
    replay = session.reward(1.0, completion_id=reply.id, idempotency_key="sdk-k1")
    assert (first.replayed, replay.replayed) == (False, True)
    assert replay.id == first.id and first.completion_id == reply.id
    assert first.scope == "completion" and first.idempotency_key == "sdk-k1"

    session.close()
    session.close()  # idempotent
    info = session.info()
    assert info.status == "closed" and info.closed_at is not None
    assert info.task_id == "sdk-flow" and info.metadata == {"k": 1} and info.train
    assert [c.id for c in info.completions] == [reply.id]
    assert [(r.id, r.value) for r in info.rewards] == [(first.id, 1.0)]

    trajectory = session.trajectory()
    assert [s["completion_id"] for s in trajectory["steps"]] == [reply.id]
    assert trajectory["return_raw"] == 1.0


def test_sibling_normalization_is_set_at_creation(gateway):
    session = gateway.create_session(sibling_normalization="none")
    assert session.trajectory()["sibling_normalization"] == "none"
    assert gateway.create_session().trajectory()["sibling_normalization"] == "mean_std"


def test_reward_without_a_key_stores_one_reward_per_call(gateway):
    session = gateway.create_session()
    complete(session)
    a, b = session.reward(0.5), session.reward(0.5)
    assert a.id != b.id and a.scope == "session"
    assert a.idempotency_key and a.idempotency_key != b.idempotency_key  # one fresh key per call
    assert len(session.info().rewards) == 2


def test_session_context_closes_on_normal_exit_and_stays_open_on_error(gateway):
    with gateway.create_session() as session:
        complete(session)
    assert session.info().status == "closed"

    with pytest.raises(RuntimeError), gateway.create_session() as failed:
        raise RuntimeError("the agent crashed")
    assert failed.info().status == "open"


def test_bound_session_reaches_a_session_created_elsewhere(gateway):
    created = gateway.create_session(id=f"sdk-bind-{uuid.uuid4().hex}")
    bound = gateway.session(created.id)
    assert (bound.id, bound.base_url) == (created.id, created.base_url)
    reply = complete(bound)
    assert [c.id for c in created.info().completions] == [reply.id]


def test_unknown_session_raises_not_found_with_the_servers_message_and_code(gateway):
    missing = gateway.session(f"sdk-missing-{uuid.uuid4().hex}")
    with pytest.raises(NotFoundError) as caught:
        missing.info()
    error = caught.value
    assert error.status_code == 404 and error.code == "session_not_found"
    assert error.message == f"no session {missing.id}"
    with pytest.raises(NotFoundError):
        missing.reward(1.0)
    with pytest.raises(NotFoundError):
        missing.trajectory()


def test_duplicate_session_id_raises_conflict(gateway):
    sid = f"sdk-dup-{uuid.uuid4().hex}"
    gateway.create_session(id=sid)
    with pytest.raises(ConflictError) as caught:
        gateway.create_session(id=sid)
    assert caught.value.status_code == 409 and caught.value.code == "session_exists"


def test_reward_on_a_retry_orphan_raises_conflict_and_stores_nothing(gateway):
    session = gateway.create_session()
    orphan = complete(session)
    complete(session)  # the same request again: a retry, which orphans the first attempt
    with pytest.raises(ConflictError) as caught:
        session.reward(1.0, completion_id=orphan.id)
    assert caught.value.code == "completion_is_orphan" and "retry" in caught.value.message
    assert session.info().rewards == []


def test_reward_on_a_session_without_completions_raises_conflict(gateway):
    with pytest.raises(ConflictError) as caught:
        gateway.create_session().reward(1.0)
    assert caught.value.code == "nothing_to_reward"


def test_invalid_session_id_raises_bad_request(gateway):
    with pytest.raises(BadRequestError) as caught:
        gateway.create_session(id="has space")
    assert caught.value.status_code == 422 and caught.value.param == "id"


def test_non_finite_reward_is_refused_before_any_request():
    gw = Gateway("http://gateway.invalid", transport=httpx.MockTransport(unexpected_request))
    for value in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="finite"):
            gw.session("s").reward(value)


async def test_async_client_runs_the_same_flow(gateway_url):
    async with AsyncGateway(gateway_url, timeout=120) as gw:
        session = await gw.create_session(task_id="sdk-async")
        client = session.openai(max_retries=0, timeout=120)
        reply = await client.chat.completions.create(
            model=MODEL_NAME, messages=MESSAGES, max_tokens=4
        )
        first = await session.reward(1.0, completion_id=reply.id, idempotency_key="sdk-ak")
        replay = await session.reward(1.0, completion_id=reply.id, idempotency_key="sdk-ak")
        assert replay.id == first.id and replay.replayed and not first.replayed
        await session.close()
        info = await session.info()
        assert info.status == "closed" and len(info.rewards) == 1
        assert [c.id for c in info.completions] == [reply.id]
        assert [s["completion_id"] for s in (await session.trajectory())["steps"]] == [reply.id]

        with pytest.raises(NotFoundError) as caught:
            await gw.session(f"sdk-missing-{uuid.uuid4().hex}").info()
        assert caught.value.code == "session_not_found"
        with pytest.raises(ConflictError):
            await gw.create_session(id=session.id)

        async with await gw.create_session() as scoped:
            pass
        assert (await scoped.info()).status == "closed"


# ----------------------------------------------------------------------------- faults


def unexpected_request(request: httpx.Request) -> httpx.Response:
    raise AssertionError(f"no request expected, got {request.method} {request.url}")


def session_json(sid: str = "s1", **fields) -> dict:
    return {
        "id": sid,
        "group_id": None,
        "task_id": None,
        "metadata": {},
        "train": True,
        "status": "open",
        "base_url": f"http://gw/sessions/{sid}/v1",
        "created_at": "2025-01-01T00:00:00Z",
        "closed_at": None,
        **fields,
    }


def reward_json(key: str) -> dict:
    return {
        "id": 7,
        "value": 1.0,
        "scope": "session",
        "completion_id": "c1",
        "idempotency_key": key,
        "counts": True,
        "created_at": "2025-01-01T00:00:00Z",
    }


class Script:
    """A MockTransport handler answering from a script, recording every request it gets."""

    def __init__(self, *answers: httpx.Response | Exception | Callable) -> None:
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer(request) if callable(answer) else answer

    def gateway(self, **kwargs) -> Gateway:
        return Gateway("http://gw", transport=httpx.MockTransport(self), **kwargs)


def unavailable(status: int = 503) -> httpx.Response:
    body = {"error": {"message": "busy", "type": "api_error", "param": None, "code": "busy"}}
    return httpx.Response(status, json=body)


def test_binding_a_session_sends_no_request():
    gw = Gateway("http://gw/", transport=httpx.MockTransport(unexpected_request))
    session = gw.session("episode-1")
    assert session.id == "episode-1"
    assert session.base_url == "http://gw/sessions/episode-1/v1"


def test_503_on_a_get_is_retried():
    script = Script(unavailable(), httpx.Response(200, json=session_json(completions=[])))
    info = script.gateway().session("s1").info()
    assert info.id == "s1" and info.status == "open"
    assert [r.method for r in script.requests] == ["GET", "GET"]


def test_503_on_create_without_id_is_not_retried():
    script = Script(unavailable(), httpx.Response(201, json=session_json()))
    with pytest.raises(ServerError) as caught:
        script.gateway().create_session()
    assert caught.value.status_code == 503 and caught.value.code == "busy"
    assert len(script.requests) == 1


def test_connection_error_on_create_without_id_is_not_retried():
    script = Script(httpx.ConnectError("refused"), httpx.Response(201, json=session_json()))
    with pytest.raises(GatewayConnectionError):
        script.gateway().create_session()
    assert len(script.requests) == 1


def test_create_with_an_id_is_retried():
    script = Script(unavailable(502), httpx.Response(201, json=session_json("mine")))
    session = script.gateway().create_session(id="mine")
    assert session.id == "mine" and len(script.requests) == 2
    assert json.loads(script.requests[1].content) == {"id": "mine", "train": True}


def test_retried_create_that_finds_its_own_session_returns_it():
    exists = httpx.Response(
        409,
        json={"error": {"message": "exists", "type": "conflict_error", "code": "session_exists"}},
    )
    found = httpx.Response(200, json=session_json("mine", task_id="t", completions=[], rewards=[]))
    script = Script(httpx.ReadTimeout("lost answer"), exists, found)
    session = script.gateway().create_session(id="mine", task_id="t")
    assert session.id == "mine"
    assert [r.method for r in script.requests] == ["POST", "POST", "GET"]


def test_retried_create_that_finds_another_session_raises_conflict():
    exists = httpx.Response(
        409,
        json={"error": {"message": "exists", "type": "conflict_error", "code": "session_exists"}},
    )
    other = httpx.Response(200, json=session_json("mine", task_id="someone-else"))
    script = Script(httpx.ReadTimeout("lost answer"), exists, other)
    with pytest.raises(ConflictError):
        script.gateway().create_session(id="mine", task_id="t")


def test_connection_errors_on_a_get_are_retried_then_raised():
    script = Script(*[httpx.ConnectError("refused")] * 3)
    with pytest.raises(GatewayConnectionError) as caught:
        script.gateway().session("s1").trajectory()
    assert isinstance(caught.value.__cause__, httpx.ConnectError)
    assert len(script.requests) == 3  # one try and max_retries=2


def test_429_is_retried_as_often_as_allowed_then_raised():
    script = Script(unavailable(429), unavailable(429))
    with pytest.raises(RateLimitError):
        script.gateway(max_retries=1).session("s1").close()
    assert len(script.requests) == 2


def test_reward_retries_resend_the_same_generated_key():
    script = Script(
        httpx.ReadTimeout("lost answer"),
        lambda r: httpx.Response(200, json=reward_json(r.headers["Idempotency-Key"])),
    )
    reward = script.gateway().session("s1").reward(1.0)
    first, second = (r.headers["Idempotency-Key"] for r in script.requests)
    assert first == second == reward.idempotency_key and reward.replayed


def test_api_key_is_sent_as_bearer_and_handed_to_openai():
    script = Script(lambda r: httpx.Response(201, json=session_json()))
    session = script.gateway(api_key="agent-key").create_session()
    assert script.requests[0].headers["Authorization"] == "Bearer agent-key"
    assert session.openai().api_key == "agent-key"
    anonymous = Gateway("http://gw", transport=httpx.MockTransport(unexpected_request))
    assert anonymous.session("s").openai().api_key == "unused"


def test_session_openai_clients_share_one_tls_context_each_with_its_own_pool(monkeypatch):
    """Building a TLS context loads the CA bundle (20-150 ms of CPU); an agent makes a client per
    session, so the SDK builds the context once. A client the caller passes is used as given."""
    made: list[tuple[str, dict]] = []

    def recording(base: type, kind: str) -> type:
        class Recording(base):
            def __init__(self, **kwargs) -> None:
                made.append((kind, kwargs))
                super().__init__(**kwargs)

        return Recording

    monkeypatch.setattr(openai, "DefaultHttpxClient", recording(openai.DefaultHttpxClient, "sync"))
    monkeypatch.setattr(
        openai, "DefaultAsyncHttpxClient", recording(openai.DefaultAsyncHttpxClient, "async")
    )
    gateway = Gateway("http://gw", transport=httpx.MockTransport(unexpected_request))
    first, second = gateway.session("s1").openai(), gateway.session("s2").openai()
    bound = AsyncGateway("http://gw", transport=httpx.MockTransport(unexpected_request))
    third = bound.session("s3").openai()
    assert [kind for kind, _ in made] == ["sync", "sync", "async"]
    contexts = [kwargs["verify"] for _, kwargs in made]
    assert isinstance(contexts[0], ssl.SSLContext)
    assert all(context is contexts[0] for context in contexts)
    assert first._client is not second._client  # a connection pool per client
    assert third.base_url == "http://gw/sessions/s3/v1/"
    own = openai.DefaultHttpxClient()
    assert gateway.session("s4").openai(http_client=own)._client is own
    assert len(made) == 4  # only `own` itself was built


def test_an_error_page_that_is_not_json_still_maps_to_its_class():
    script = Script(httpx.Response(502, text="<html>Bad Gateway</html>"))
    with pytest.raises(ServerError) as caught:
        script.gateway(max_retries=0).session("s1").info()
    assert caught.value.code is None and "Bad Gateway" in caught.value.message


async def test_async_client_retries_a_get_but_not_a_create_without_id():
    answers = Script(
        unavailable(), httpx.Response(200, json=session_json()), unavailable(), unavailable()
    )

    async def handler(request: httpx.Request) -> httpx.Response:
        return answers(request)

    async with AsyncGateway("http://gw", transport=httpx.MockTransport(handler)) as gw:
        assert (await gw.session("s1").info()).id == "s1"
        with pytest.raises(ServerError):
            await gw.create_session()
    assert [r.method for r in answers.requests] == ["GET", "GET", "POST"]
