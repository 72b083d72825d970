"""GET /metrics: behind the admin key; request, recording and backend metrics match what happened;
the database-derived gauges match the rows; a failed database read still answers."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from gateway.main import create_app
from gateway.metrics.reasons import reason_kind
from migrations.runner import upgrade
from rlgw.db.engine import make_sync_engine, sync_session_factory
from rlgw.registry import register_backend

from conftest import ADMIN_KEY, MODEL_NAME, LiveServer, free_port, gateway_settings
from pg_fault_proxy import REFUSE, PgFaultProxy

SPARE = "spare"  # a model whose one backend nothing listens on
CHAT = [{"role": "user", "content": "Count to three."}]
Samples = dict[tuple[str, frozenset], float]


@dataclass
class Stack:
    url: str
    db_url: str
    backend_id: int  # the real vLLM server, of MODEL_NAME
    spare_id: int

    def admin(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=120, headers={"X-Admin-Key": ADMIN_KEY})


def scrape(client: httpx.Client) -> Samples:
    reply = client.get("/metrics")
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"].startswith("text/plain")
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(reply.text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def names(samples: Samples) -> set[str]:
    return {name for name, _ in samples}


@pytest.fixture(scope="module")
def stack(make_database: Callable[[], str], vllm_url: str, tiny_model_dir: Path) -> Iterator[Stack]:
    db_url = make_database()
    upgrade(db_url)
    engine = make_sync_engine(db_url)
    backend_id = register_backend(
        sync_session_factory(engine), MODEL_NAME, vllm_url, model_path=str(tiny_model_dir)
    )
    with engine.begin() as conn:
        model_id = conn.execute(
            text("INSERT INTO models (name) VALUES (:n) RETURNING id"), {"n": SPARE}
        ).scalar_one()
        spare_id = conn.execute(
            text(
                "INSERT INTO backends (model_id, url, state, served_version) "
                "VALUES (:m, :u, 'active', 0) RETURNING id"
            ),
            {"m": model_id, "u": f"http://127.0.0.1:{free_port()}"},
        ).scalar_one()
    engine.dispose()
    with LiveServer(create_app(gateway_settings(db_url)), free_port()) as live:
        yield Stack(live.url, db_url, backend_id, spare_id)


def wait_until(check: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        time.sleep(0.1)


# ----------------------------------------------------------------------------- auth


def test_metrics_without_a_key_is_401_and_shows_nothing(stack: Stack):
    reply = httpx.get(stack.url + "/metrics")
    assert reply.status_code == 401
    assert reply.json()["error"]["code"] == "missing_admin_key"
    assert "rlgw_" not in reply.text and MODEL_NAME not in reply.text


@pytest.mark.parametrize(
    "headers",
    [{"X-Admin-Key": "guess-123"}, {"Authorization": "Bearer guess-123"}],
    ids=["x-admin-key", "bearer"],
)
def test_metrics_with_a_wrong_key_is_403_and_shows_nothing(stack: Stack, headers):
    reply = httpx.get(stack.url + "/metrics", headers=headers)
    assert reply.status_code == 403
    assert reply.json()["error"]["code"] == "invalid_admin_key"
    assert "rlgw_" not in reply.text and "guess-123" not in reply.text


def test_metrics_take_the_key_as_bearer_too(stack: Stack):
    reply = httpx.get(stack.url + "/metrics", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    assert reply.status_code == 200
    assert "rlgw_http_requests_total" in reply.text


# ----------------------------------------------------------------------------- traffic


def test_request_and_recording_metrics_match_the_traffic(stack: Stack):
    with stack.admin() as admin, httpx.Client(base_url=stack.url, timeout=120) as http:
        before = scrape(admin)
        replies = [
            http.post(
                "/v1/chat/completions",
                json={"model": MODEL_NAME, "messages": CHAT, "max_tokens": 4},
            )
            for _ in range(3)
        ]
        with http.stream(
            "POST",
            "/v1/chat/completions",
            json={"model": MODEL_NAME, "messages": CHAT, "max_tokens": 4, "stream": True},
        ) as stream:
            assert "[DONE]" in stream.read().decode()
            replies.append(stream)
        replies += [
            http.post(
                "/v1/completions", json={"model": MODEL_NAME, "prompt": "one two", "max_tokens": 4}
            )
            for _ in range(2)
        ]
        assert [r.status_code for r in replies] == [200] * 6
        unknown = http.post(
            "/v1/chat/completions", json={"model": "no-such-model", "messages": CHAT}
        )
        assert unknown.status_code == 404
        # Expected recording outcomes, read back through the admin API (not from SQL).
        kinds: dict[str, int] = {}
        for reply in replies:
            record = admin.get(f"/admin/completions/{reply.headers['X-Completion-Id']}").json()
            kind = "" if record["eligible"] else reason_kind(record["eligibility_reason"])
            kinds[kind] = kinds.get(kind, 0) + 1

        expected = {
            ("chat", "200", MODEL_NAME): 4,
            ("completions", "200", MODEL_NAME): 2,
            ("chat", "404", ""): 1,  # a model it does not serve is not a label value
        }

        def delta(name: str, **labels: str) -> float:
            return value(after, name, **labels) - value(before, name, **labels)

        def settled() -> bool:
            nonlocal after
            after = scrape(admin)
            return all(
                delta("rlgw_http_requests_total", api=a, status=s, model=m) == n
                for (a, s, m), n in expected.items()
            )

        after: Samples = {}
        wait_until(settled, "request counters reach the traffic sent")
    for (api, status, model), n in expected.items():
        labels = {"api": api, "status": status, "model": model}
        assert delta("rlgw_http_requests_total", **labels) == n
        assert delta("rlgw_http_request_duration_seconds_count", **labels) == n
        assert delta("rlgw_http_request_duration_seconds_bucket", **labels, le="+Inf") == n
        assert delta("rlgw_http_request_duration_seconds_sum", **labels) > 0
    assert (
        value(after, "rlgw_http_requests_total", api="chat", status="404", model="no-such-model")
        == 0
    )
    assert delta("rlgw_recorder_written_total") == 6
    assert value(after, "rlgw_recorder_backlog") == 0
    for kind, n in kinds.items():
        labels = (
            {"eligible": "true", "reason": ""}
            if kind == ""
            else {"eligible": "false", "reason": kind}
        )
        assert delta("rlgw_completions_recorded_total", **labels) == n
    assert kinds.get("", 0) >= 1  # the tiny model stops or runs out of tokens: trainable


def test_refused_requests_are_counted_under_their_status(stack: Stack):
    with stack.admin() as admin, httpx.Client(base_url=stack.url, timeout=60) as http:
        before = scrape(admin)
        assert http.post("/v1/chat/completions", json={"messages": CHAT}).status_code == 400
        assert http.get("/no/such/path").status_code == 404
        after = scrape(admin)
    assert (
        value(after, "rlgw_http_requests_total", api="chat", status="400", model="")
        - value(before, "rlgw_http_requests_total", api="chat", status="400", model="")
        == 1
    )
    assert (
        value(after, "rlgw_http_requests_total", api="other", status="404", model="")
        - value(before, "rlgw_http_requests_total", api="other", status="404", model="")
        == 1
    )


# ----------------------------------------------------------------------------- backends


def test_backends_by_state_follow_an_admin_drain(stack: Stack):
    with stack.admin() as admin:
        wait_until(
            lambda: (
                value(scrape(admin), "rlgw_backends_reachable", model=SPARE, state="active") == 0
            ),
            "the health probe finds the spare backend unreachable",
        )
        before = scrape(admin)
        assert value(before, "rlgw_backends", model=SPARE, state="active") == 1
        assert value(before, "rlgw_backends", model=SPARE, state="draining") == 0
        assert value(before, "rlgw_backends", model=MODEL_NAME, state="active") == 1
        assert value(before, "rlgw_backends_reachable", model=MODEL_NAME, state="active") == 1
        reply = admin.post(f"/admin/backends/{stack.spare_id}/drain")
        assert reply.status_code == 200, reply.text
        after = scrape(admin)
    assert value(after, "rlgw_backends", model=SPARE, state="active") == 0
    assert value(after, "rlgw_backends", model=SPARE, state="draining") == 1
    assert value(after, "rlgw_backends", model=MODEL_NAME, state="active") == 1
    assert value(after, "rlgw_registry_following") == 1
    assert (
        value(after, "rlgw_backend_in_flight", model=MODEL_NAME, backend=str(stack.backend_id)) == 0
    )


# ----------------------------------------------------------------------------- database


def insert_session(
    conn,
    sid: str,
    status: str,
    *,
    train: bool = True,
    closed_ago_s: float = 0,
    rewarded: bool = True,
) -> None:
    conn.execute(
        text(
            "INSERT INTO sessions (id, status, train, closed_at) VALUES "
            "(:id, :status, :train, now() - make_interval(secs => :ago))"
        ),
        {"id": sid, "status": status, "train": train, "ago": closed_ago_s},
    )
    if rewarded:
        conn.execute(
            text("INSERT INTO rewards (session_id, value, scope) VALUES (:id, 1.0, 'session')"),
            {"id": sid},
        )


def test_database_gauges_match_the_rows(stack: Stack):
    swaps = {1: "swapped", 2: "swapped", 3: "rolled_back"}
    engine = create_engine(stack.db_url)
    with engine.begin() as conn:
        model_id = conn.execute(
            text("SELECT id FROM models WHERE name = :n"), {"n": MODEL_NAME}
        ).scalar_one()
        for version, outcome in swaps.items():
            conn.execute(
                text(
                    "INSERT INTO policy_versions (model_id, version, kind, metrics) VALUES "
                    "(:m, :v, 'delta', CAST(:metrics AS jsonb))"
                ),
                {
                    "m": model_id,
                    "v": version,
                    "metrics": f'{{"reward_mean": {version / 4}, "pause_s": {version / 10}, '
                    f'"step_s": {version * 1.5}, "swaps": {{"{stack.backend_id}": "{outcome}"}}}}',
                },
            )
        # Version 4 is committed, its swap not yet recorded: no pause or step time so far.
        conn.execute(
            text(
                "INSERT INTO policy_versions (model_id, version, kind, metrics) VALUES "
                """(:m, 4, 'delta', '{"reward_mean": 0.875}')"""
            ),
            {"m": model_id},
        )
        conn.execute(text("UPDATE models SET current_version = 4 WHERE id = :m"), {"m": model_id})
        # 1,005 versions of the spare model: only the latest 1,000 are counted; the latest
        # reports an outcome the trainer does not write, counted as "other".
        spare_id = conn.execute(
            text("SELECT id FROM models WHERE name = :n"), {"n": SPARE}
        ).scalar_one()
        conn.execute(
            text(
                "INSERT INTO policy_versions (model_id, version, kind, metrics) "
                "SELECT :m, v, 'delta', jsonb_build_object('swaps', jsonb_build_object('9', "
                "CASE WHEN v = 1005 THEN 'exploded' ELSE 'swapped' END)) "
                "FROM generate_series(1, 1005) AS v"
            ),
            {"m": spare_id},
        )
        insert_session(conn, "lag-old", "closed", closed_ago_s=120)
        insert_session(conn, "lag-new", "closed", closed_ago_s=10)
        insert_session(conn, "lag-unrewarded", "closed", closed_ago_s=500, rewarded=False)
        insert_session(conn, "lag-held-out", "closed", train=False, closed_ago_s=600)
        insert_session(conn, "lag-claimed", "claimed", closed_ago_s=700)
        insert_session(conn, "lag-consumed", "consumed", closed_ago_s=800)
    engine.dispose()
    with stack.admin() as admin:
        samples = scrape(admin)
    assert value(samples, "rlgw_model_current_version", model=MODEL_NAME) == 4
    assert value(samples, "rlgw_model_current_version", model=SPARE) == 0
    assert (
        value(
            samples, "rlgw_backend_versions_behind", model=MODEL_NAME, backend=str(stack.backend_id)
        )
        == 4
    )
    assert value(samples, "rlgw_trainer_backlog_sessions") == 2
    assert 119 <= value(samples, "rlgw_trainer_backlog_oldest_seconds") < 180
    assert value(samples, "rlgw_recent_swaps", model=MODEL_NAME, outcome="swapped") == 2
    assert value(samples, "rlgw_recent_swaps", model=MODEL_NAME, outcome="rolled_back") == 1
    assert value(samples, "rlgw_recent_swaps", model=SPARE, outcome="swapped") == 999
    assert value(samples, "rlgw_recent_swaps", model=SPARE, outcome="other") == 1
    assert value(samples, "rlgw_last_swap_pause_seconds", model=MODEL_NAME) == pytest.approx(0.3)
    assert value(samples, "rlgw_last_step_seconds", model=MODEL_NAME) == pytest.approx(4.5)
    assert value(samples, "rlgw_last_reward_mean", model=MODEL_NAME) == pytest.approx(0.875)
    assert value(samples, "rlgw_metrics_scrape_errors_total", source="database") == 0


# ----------------------------------------------------------------------------- database down


@pytest.fixture(scope="module")
def proxied(
    make_database: Callable[[], str], vllm_url: str, tiny_model_dir: Path
) -> Iterator[tuple[str, PgFaultProxy]]:
    """A gateway whose database is reached through a fault proxy, giving up on a record after
    1 s without the database."""
    db_url = make_database()
    upgrade(db_url)
    target = make_url(db_url)
    if not target.host or target.host.startswith("/"):
        pytest.skip("the test Postgres is not reached over TCP")
    engine = make_sync_engine(db_url)
    register_backend(
        sync_session_factory(engine), MODEL_NAME, vllm_url, model_path=str(tiny_model_dir)
    )
    engine.dispose()
    with PgFaultProxy(target.host, target.port or 5432) as proxy:
        settings = gateway_settings(
            proxy.url_for(db_url), database_connect_timeout_s=2, record_retry_s=1.0
        )
        with LiveServer(create_app(settings), free_port()) as live:
            yield live.url, proxy


def test_a_failed_database_read_is_counted_and_the_rest_still_answers(proxied):
    url, proxy = proxied
    with httpx.Client(base_url=url, timeout=30, headers={"X-Admin-Key": ADMIN_KEY}) as admin:
        assert "rlgw_trainer_backlog_sessions" in names(scrape(admin))
        proxy.blackhole()
        proxy.cut()
        try:
            t0 = time.monotonic()
            down = scrape(admin)
            took = time.monotonic() - t0
        finally:
            proxy.resume()
        assert took < 8, f"a scrape waited {took:.1f} s for the database"
        assert value(down, "rlgw_metrics_scrape_errors_total", source="database") == 1
        assert "rlgw_trainer_backlog_sessions" not in names(down)
        assert "rlgw_http_requests_total" in names(down)
        assert "rlgw_recorder_written_total" in names(down)
        wait_until(
            lambda: "rlgw_trainer_backlog_sessions" in names(scrape(admin)),
            "the database-derived metrics come back",
            timeout_s=20,
        )


def test_a_doubtful_commit_is_counted_once_marked(proxied):
    """The COMMIT lands, its answer is lost and the database stays away past the retry time:
    the caller gets 503 (a failed record); once the database is back the row is marked, and
    only then counted, as doubtful_commit."""
    url, proxy = proxied
    with httpx.Client(base_url=url, timeout=60, headers={"X-Admin-Key": ADMIN_KEY}) as admin:
        wait_until(
            lambda: admin.get("/healthz").json()["registry"]["following"],
            "the gateway follows the registry",
            timeout_s=30,
        )
        before = scrape(admin)
        proxy.trap_commit(nth=1, forward=True, then=REFUSE)
        try:
            reply = admin.post(
                "/v1/chat/completions",
                json={"model": MODEL_NAME, "messages": CHAT, "max_tokens": 4},
            )
            assert reply.status_code == 503, reply.text
            assert proxy.trap_sprung.is_set()
        finally:
            proxy.resume()
        doubtful = {"eligible": "false", "reason": "doubtful_commit"}

        def marked() -> bool:
            return value(scrape(admin), "rlgw_completions_recorded_total", **doubtful) == 1

        wait_until(marked, "the doubtful row is marked and counted", timeout_s=30)
        after = scrape(admin)
    assert (
        value(after, "rlgw_recorder_failed_total") - value(before, "rlgw_recorder_failed_total")
        == 1
    )
    assert value(after, "rlgw_recorder_written_total") == value(
        before, "rlgw_recorder_written_total"
    )
    assert value(after, "rlgw_completions_recorded_total", eligible="true", reason="") == value(
        before, "rlgw_completions_recorded_total", eligible="true", reason=""
    )
