"""Database faults (issue #7): Postgres cut off, refusing, black-holed, restarting, losing a COMMIT.

The gateways under test reach Postgres through a TCP fault proxy (`pg_fault_proxy.py`). Whatever
happens, a call the client was told succeeded is stored exactly once; a call that could not be
stored fails with 503 `database_unavailable` or `database_timeout` (a stream ends in an error
event, never `[DONE]`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx
import openai
import psycopg
import pytest
from sqlalchemy.engine import make_url

from gateway.main import create_app
from migrations.runner import upgrade
from rlgw.db.engine import make_sync_engine, sync_session_factory
from rlgw.db.urls import to_libpq_uri
from rlgw.eligibility import CROSSED_SWAP, DOUBTFUL_COMMIT
from rlgw.registry import register_backend

from auth_helpers import TOKEN_SECRET, mint_key
from conftest import ADMIN_KEY, MODEL_NAME, LiveServer, free_port, gateway_settings
from pg_fault_proxy import REFUSE, PgFaultProxy

QUESTION = [{"role": "user", "content": "Say something about databases."}]
MAX_TOKENS = 8


class Gateway:
    """A live test gateway and the app behind it (its recorder's counters are read directly)."""

    def __init__(self, app, url: str) -> None:
        self.app, self.url = app, url
        self.admin = httpx.Client(
            base_url=url, timeout=60, headers={"Authorization": f"Bearer {ADMIN_KEY}"}
        )

    @property
    def recorder(self):
        return self.app.state.context.recorder

    def client(self, api_key: str = "unused", **kwargs) -> openai.OpenAI:
        # No client retries: each call must show the gateway's own answer.
        return openai.OpenAI(
            base_url=f"{self.url}/v1", api_key=api_key, max_retries=0, timeout=120, **kwargs
        )

    def wait_healthy(self, timeout_s: float = 30.0) -> None:
        """Until the database answers and the registry is followed again (before that, calls
        are recorded as not trainable: a swap could not be ruled out)."""
        deadline = time.monotonic() + timeout_s
        while not _recovered(reply := self.admin.get("/healthz")):
            assert time.monotonic() < deadline, f"the gateway did not recover: {reply.text}"
            time.sleep(0.1)


def _recovered(health: httpx.Response) -> bool:
    return health.status_code == 200 and health.json()["registry"]["following"]


@contextmanager
def _gateway(database_url: str, **overrides) -> Iterator[Gateway]:
    settings = gateway_settings(database_url, database_connect_timeout_s=2, **overrides)
    app = create_app(settings)
    with LiveServer(app, free_port()) as live:
        gateway = Gateway(app, live.url)
        yield gateway
        gateway.admin.close()


@pytest.fixture(scope="module")
def fault_db(make_database: Callable[[], str], vllm_url: str, tiny_model_dir: Path) -> str:
    """A fresh database with the real vLLM backend registered."""
    url = make_database()
    upgrade(url)
    engine = make_sync_engine(url)
    try:
        register_backend(
            sync_session_factory(engine), MODEL_NAME, vllm_url, model_path=str(tiny_model_dir)
        )
    finally:
        engine.dispose()
    return url


@pytest.fixture(scope="module")
def proxy(fault_db: str) -> Iterator[PgFaultProxy]:
    target = make_url(fault_db)
    if not target.host or target.host.startswith("/"):
        pytest.skip("the test Postgres is not reached over TCP")
    with PgFaultProxy(target.host, target.port or 5432) as proxy:
        yield proxy


@pytest.fixture(scope="module")
def db(fault_db: str) -> Iterator[psycopg.Connection]:
    """A direct connection to the database (not through the proxy), to check what is stored."""
    with psycopg.connect(to_libpq_uri(fault_db), autocommit=True) as conn:
        yield conn


@pytest.fixture(scope="module")
def quick(proxy: PgFaultProxy, fault_db: str) -> Iterator[Gateway]:
    """Gives up after 1 s without the database. Auth on: keys are looked up in the database
    (and cached long, so a key used once keeps working without it)."""
    with _gateway(
        proxy.url_for(fault_db),
        record_retry_s=1.0,
        auth="on",
        token_secret=TOKEN_SECRET,
        auth_cache_s=3600,
    ) as gateway:
        yield gateway


@pytest.fixture(scope="module")
def patient(proxy: PgFaultProxy, fault_db: str) -> Iterator[Gateway]:
    """Waits up to 60 s for the database; a queue of one record, to see the bound."""
    with _gateway(proxy.url_for(fault_db), record_retry_s=60.0, record_queue_size=1) as gateway:
        yield gateway


@pytest.fixture(scope="module")
def agent_key(quick: Gateway) -> str:
    """A key of the quick gateway, used once so that it is cached."""
    key = mint_key(quick.admin, "faults")["key"]
    _chat(quick.client(key))
    return key


@pytest.fixture(autouse=True)
def database_back(proxy: PgFaultProxy, quick: Gateway, patient: Gateway) -> Iterator[None]:
    """Every test starts and ends with the database reachable and both gateways healthy."""
    proxy.resume()
    quick.wait_healthy()
    patient.wait_healthy()
    yield
    proxy.resume()
    quick.wait_healthy()
    patient.wait_healthy()


def _chat(client: openai.OpenAI, messages: list[dict] | None = None, **kwargs):
    return client.chat.completions.create(
        model=MODEL_NAME,
        messages=messages or QUESTION,
        max_tokens=MAX_TOKENS,
        # Nearly greedy but sampled: a greedy completion is never trained on (rlgw/sampling.py),
        # and these tests follow completions that are eligible until a fault says otherwise.
        temperature=0.01,
        seed=0,
        **kwargs,
    )


def _record(gateway: Gateway, completion_id: str) -> dict | None:
    reply = gateway.admin.get(f"/admin/completions/{completion_id}")
    if reply.status_code == 404:
        return None
    assert reply.status_code == 200, reply.text
    return reply.json()


def _rows(db: psycopg.Connection, where: str, *params) -> list[tuple]:
    return db.execute(f"SELECT id, parent_id FROM completions WHERE {where}", params).fetchall()


# What a lost write is called: a refused or dropped connection says the database is down; an
# attempt cut off because nothing answered says it was too slow. A black hole is either,
# depending on whether the connect timeout or the write's own deadline fires first.
CODES = {
    "refuse": {"database_unavailable"},
    "blackhole": {"database_unavailable", "database_timeout"},
    "slow": {"database_timeout"},
}


def _assert_unavailable(exc: openai.APIStatusError, fault: str = "refuse") -> None:
    assert exc.status_code == 503, exc
    assert exc.body["code"] in CODES[fault], exc.body
    assert exc.response.headers.get("retry-after")


def _wait_until(condition: Callable[[], object], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


# ----------------------------------------------------------------------------- outage: 503


@pytest.mark.parametrize("fault", ["refuse", "blackhole"])
def test_calls_fail_with_503_while_the_database_is_unreachable(
    quick: Gateway, proxy: PgFaultProxy, agent_key: str, fault: str
) -> None:
    client = quick.client(agent_key)
    before = _chat(client)  # committed before the fault
    stored_before = _record(quick, before.id)
    assert stored_before is not None and stored_before["status"] == "complete"

    getattr(proxy, fault)()
    proxy.cut()
    t0 = time.monotonic()
    with pytest.raises(openai.APIStatusError) as failed:
        _chat(client)
    _assert_unavailable(failed.value, fault)
    lost_ids = [failed.value.response.headers["x-completion-id"]]
    assert time.monotonic() - t0 < 30  # bounded: retry time + connect timeouts, not minutes

    # Stream: the tokens flowed, but the stream ends in an error event, and the client raises.
    chunks: list = []
    with pytest.raises(openai.APIError) as stream_failed:
        for chunk in _chat(client, stream=True):
            chunks.append(chunk)
    assert not isinstance(stream_failed.value, openai.APIStatusError)  # the stream had begun
    assert stream_failed.value.code in CODES[fault]
    assert chunks and all(c.id == chunks[0].id for c in chunks)
    lost_ids.append(chunks[0].id)

    # The database returns: the earlier record is intact, the failed calls were never written,
    # and new calls succeed and are recorded, without restarting the gateway.
    proxy.resume()
    quick.wait_healthy()
    assert _record(quick, before.id) == stored_before
    for lost in lost_ids:
        assert _record(quick, lost) is None, lost
    for after in (_chat(client), _chat(client, extra_headers={"X-Session-Id": f"after-{fault}"})):
        stored_after = _record(quick, after.id)
        assert stored_after is not None and stored_after["eligible"]
        assert stored_after["output_token_ids"]


def test_every_database_use_answers_503_in_its_envelope(
    quick: Gateway, proxy: PgFaultProxy, agent_key: str
) -> None:
    unused_key = mint_key(quick.admin, "faults")["key"]  # its first lookup needs the database
    proxy.outage()

    # The raw stream: no [DONE], the last event is the error.
    body = {"model": MODEL_NAME, "messages": QUESTION, "max_tokens": 4, "stream": True}
    as_agent = {"Authorization": f"Bearer {agent_key}"}
    with httpx.stream(
        "POST", f"{quick.url}/v1/chat/completions", json=body, headers=as_agent, timeout=120
    ) as raw:
        events = [line for line in raw.iter_lines() if line.startswith("data:")]
    assert raw.status_code == 200 and len(events) > 1
    assert "[DONE]" not in "".join(events)
    assert '"database_unavailable"' in events[-1]

    # Opening a named session; looking a key up; the Messages API (Anthropic's envelope).
    with pytest.raises(openai.APIStatusError) as named:
        _chat(quick.client(agent_key), extra_headers={"X-Session-Id": "faults-named"})
    _assert_unavailable(named.value)
    with pytest.raises(openai.APIStatusError) as auth:
        _chat(quick.client(unused_key))
    _assert_unavailable(auth.value)
    anthropic = httpx.post(
        f"{quick.url}/v1/messages",
        json={"model": MODEL_NAME, "max_tokens": 4, "messages": QUESTION},
        headers={"x-api-key": agent_key, "X-Session-Id": "faults-named"},
        timeout=60,
    )
    assert anthropic.status_code == 503, anthropic.text
    assert anthropic.json()["error"]["type"] == "overloaded_error"
    # The admin and session APIs.
    for path, headers in (
        (f"/admin/completions/{raw.headers['x-completion-id']}", None),
        ("/admin/backends", None),
        ("/v1/sessions/faults-named", as_agent),
    ):
        reply = quick.admin.get(path, headers=headers)
        assert reply.status_code == 503, (path, reply.text)
        assert reply.json()["error"]["code"] == "database_unavailable"
        assert reply.headers["retry-after"]
    health = quick.admin.get("/healthz")
    assert health.status_code == 503 and health.json()["database"]["ok"] is False

    # Back: health recovers by itself, and the same calls succeed.
    proxy.resume()
    quick.wait_healthy()
    _chat(quick.client(unused_key), extra_headers={"X-Session-Id": "faults-named"})
    assert quick.admin.get("/v1/sessions/faults-named", headers=as_agent).status_code == 200


def test_a_database_that_stops_answering_fails_the_call_in_bounded_time(
    quick: Gateway, fault_db: str, db: psycopg.Connection, agent_key: str
) -> None:
    """A write that hangs (here: on a row lock held elsewhere, as on a black-holed connection)
    is cut off at the retry time: 503, nothing stored, and the next call works."""
    client = quick.client(agent_key)
    headers = {"X-Session-Id": "faults-hung"}
    _chat(client, extra_headers=headers)
    with psycopg.connect(to_libpq_uri(fault_db)) as locker:
        locker.execute("SELECT 1 FROM sessions WHERE id = 'faults-hung' FOR UPDATE")
        t0 = time.monotonic()
        with pytest.raises(openai.APIStatusError) as failed:
            _chat(client, extra_headers=headers)
        assert time.monotonic() - t0 < 30
        _assert_unavailable(failed.value, "slow")
        assert "did not confirm the write within 1 s" in failed.value.body["message"]
    lost = failed.value.response.headers["x-completion-id"]
    assert _record(quick, lost) is None
    after = _chat(client, extra_headers=headers)
    assert {r[0] for r in _rows(db, "session_id = 'faults-hung'")} >= {after.id}
    assert lost not in {r[0] for r in _rows(db, "session_id = 'faults-hung'")}


# ----------------------------------------------------------------------------- ridden out


@pytest.mark.parametrize("stream", [False, True])
def test_an_outage_shorter_than_the_retry_time_is_ridden_out(
    patient: Gateway, proxy: PgFaultProxy, db: psycopg.Connection, stream: bool
) -> None:
    count_before = db.execute("SELECT count(*) FROM completions").fetchone()[0]
    retries_before = patient.recorder.retries
    proxy.outage()
    client = patient.client()

    def call() -> str:
        if not stream:
            return _chat(client).id
        ids = {chunk.id for chunk in _chat(client, stream=True)}  # raises on an error event
        assert len(ids) == 1
        return ids.pop()

    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(call)
        _wait_until(lambda: patient.recorder.retries > retries_before or pending.done())
        assert not pending.done()  # the caller is waiting for its record
        proxy.resume()
        completion_id = pending.result(timeout=120)

    record = _record(patient, completion_id)
    assert record is not None and record["status"] == "complete" and record["eligible"]
    assert record["stream"] is stream
    assert db.execute("SELECT count(*) FROM completions").fetchone()[0] == count_before + 1


def test_a_swap_during_the_outage_excludes_the_calls_that_finished_blind(
    patient: Gateway, proxy: PgFaultProxy, db: psycopg.Connection
) -> None:
    """A call that finishes while the gateway cannot follow the registry is settled when its
    record is written: its backend's epoch moved (a swap the gateway could not hear of: here a
    bump made directly in the database), so it is stored but never trained on."""
    retries_before = patient.recorder.retries
    proxy.outage()
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(lambda: _chat(patient.client()).id)
        _wait_until(lambda: patient.recorder.retries > retries_before or pending.done())
        assert not pending.done()  # it finished generating; its record waits for the database
        db.execute("UPDATE backends SET swap_epoch = swap_epoch + 1")
        proxy.resume()
        completion_id = pending.result(timeout=120)
    record = _record(patient, completion_id)
    assert record["status"] == "complete" and record["eligible"] is False
    assert record["eligibility_reason"] == CROSSED_SWAP


def test_the_queue_stays_bounded_while_records_wait(patient: Gateway, proxy: PgFaultProxy) -> None:
    proxy.outage()
    client = patient.client()
    retries = patient.recorder.retries
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(_chat, client)  # taken by the writer, retrying
        _wait_until(lambda: patient.recorder.retries > retries)
        second = pool.submit(_chat, client)  # waits in the queue (size 1)
        _wait_until(lambda: patient.recorder.backlog == 1)
        with pytest.raises(openai.APIStatusError) as full:
            _chat(client)
        assert full.value.status_code == 503
        assert full.value.body["code"] == "recorder_overloaded"
        proxy.resume()
        for done in (first, second):
            assert _record(patient, done.result(timeout=120).id) is not None


# ----------------------------------------------------------------------------- restarts


@pytest.mark.parametrize("fault", ["terminate", "cut"])
def test_a_restart_between_calls_is_recovered_transparently(
    quick: Gateway,
    patient: Gateway,
    proxy: PgFaultProxy,
    db: psycopg.Connection,
    fault_db: str,
    agent_key: str,
    fault: str,
) -> None:
    for gateway, key in ((quick, agent_key), (patient, "unused")):
        _chat(gateway.client(key))  # pooled connections exist
    if fault == "terminate":  # what a Postgres restart does to its clients
        name = make_url(fault_db).database
        terminated = db.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            (name,),
        ).fetchone()[0]
        assert terminated >= 2
    else:
        proxy.cut()
    for gateway, key in ((quick, agent_key), (patient, "unused")):
        client = gateway.client(key)
        plain = _chat(client, extra_headers={"X-Session-Id": f"restart-{fault}-{key[:6]}"})
        streamed = [c.id for c in _chat(client, stream=True)]
        for completion_id in (plain.id, streamed[0]):
            assert _record(gateway, completion_id) is not None
        assert gateway.admin.get("/healthz").status_code == 200


# ----------------------------------------------------------------------------- lost COMMITs


@pytest.mark.parametrize(
    ("named", "forward"), [(True, True), (True, False), (False, True)], ids=str
)
def test_a_commit_with_unknown_outcome_is_stored_once(
    patient: Gateway, proxy: PgFaultProxy, db: psycopg.Connection, named: bool, forward: bool
) -> None:
    """The connection dies during COMMIT: the server either committed it (forward) or not. The
    retry finds out under the session's lock and stores the completion exactly once."""
    session = f"commit-{named}-{forward}"
    headers = {"X-Session-Id": session} if named else {}
    client = patient.client()
    first = _chat(client, extra_headers=headers)
    follow_up = [*QUESTION, {"role": "assistant", "content": first.choices[0].message.content}]
    follow_up.append({"role": "user", "content": "And then?"})
    retries = patient.recorder.retries

    # A named session commits twice per call: the session's creation first, then the record.
    proxy.trap_commit(nth=2 if named else 1, forward=forward)
    second = _chat(client, messages=follow_up, extra_headers=headers)  # succeeds
    assert proxy.trap_sprung.is_set()
    assert patient.recorder.retries > retries

    assert _rows(db, "id = %s", second.id) != []
    if named:  # lineage was linked once: the follow-up continues the first completion
        rows = dict(_rows(db, "session_id = %s", session))
        assert set(rows) == {first.id, second.id}
        assert rows[second.id] == first.id
    record = _record(patient, second.id)
    assert record["status"] == "complete" and record["eligible"]


def test_a_commit_that_landed_after_the_caller_gave_up_is_made_ineligible(
    quick: Gateway, proxy: PgFaultProxy, db: psycopg.Connection, agent_key: str
) -> None:
    """The COMMIT reaches the server, the answer is lost, and the database stays away past the
    retry time: the caller gets 503, so the stored row must never be trained on."""
    client = quick.client(agent_key)
    proxy.trap_commit(nth=1, forward=True, then=REFUSE)
    with pytest.raises(openai.APIStatusError) as failed:
        _chat(client)
    _assert_unavailable(failed.value)
    completion_id = failed.value.response.headers["x-completion-id"]
    assert proxy.trap_sprung.is_set()
    assert len(_rows(db, "id = %s", completion_id)) == 1  # it did commit

    proxy.resume()

    def marked() -> bool:
        return db.execute(
            "SELECT ineligible_reasons <> '{}' FROM completions WHERE id = %s", (completion_id,)
        ).fetchone()[0]

    _wait_until(marked, timeout_s=30)
    record = _record(quick, completion_id)
    assert record["eligible"] is False and record["eligibility_reason"] == DOUBTFUL_COMMIT
    assert record["status"] == "complete"  # what happened is kept; only training is refused


def test_a_doubtful_commit_is_still_marked_after_the_gateway_restarts(
    proxy: PgFaultProxy, fault_db: str, db: psycopg.Connection, tmp_path: Path
) -> None:
    """As above, but the gateway stops before the database returns: the id waits in the
    journal under its home, and the next gateway on that database marks the row."""
    url = proxy.url_for(fault_db)
    with _gateway(url, record_retry_s=1.0, home=tmp_path) as first:
        _chat(first.client())  # connections and caches warm: the trap catches the record's commit
        proxy.trap_commit(nth=1, forward=True, then=REFUSE)
        with pytest.raises(openai.APIStatusError) as failed:
            _chat(first.client())
        completion_id = failed.value.response.headers["x-completion-id"]
        assert proxy.trap_sprung.is_set()
        journal = first.recorder._doubtful.journal
    (journal_file,) = journal.directory.glob("*.jsonl")
    assert completion_id in journal_file.read_text()
    eligible = "SELECT ineligible_reasons = '{}' FROM completions WHERE id = %s"
    assert db.execute(eligible, (completion_id,)).fetchone() == (True,)  # nobody marked it yet

    proxy.resume()
    with _gateway(url, record_retry_s=1.0, home=tmp_path) as second:
        _wait_until(lambda: db.execute(eligible, (completion_id,)).fetchone() == (False,), 30)
        record = _record(second, completion_id)
        assert record["eligibility_reason"] == DOUBTFUL_COMMIT
        _wait_until(lambda: not list(journal.directory.glob("*.jsonl")), 10)
