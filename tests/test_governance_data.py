"""Whose data may change the model, and taking it back: training consent per tenant (a tenant
without it is recorded and served but never consumed), provenance in the ledger and the export,
purging a tenant (everything of it goes, nothing of another; refused while an update holds a
claim; what was trained into a version is reported and the ledger keeps its tenant and counts),
retention (texts dropped, tokens kept; whole records after their period), and clear refusals of
bad input on the API and the CLI.

Real Postgres and the suite's real vLLM server. The trainer runs with no backend registered (its
versions are recorded, nothing is swapped), so the shared server keeps the base weights."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from sqlalchemy import text

from gateway.main import create_app
from rlgw.db.engine import make_sync_engine, sync_session_factory
from rlgw.export import write_jsonl
from trainer.loop.claims import TrainerInstance, claim_sessions, unclaim

from conftest import MODEL_NAME, LiveServer, free_port, gateway_settings
from governance_helpers import TOKEN_SECRET, Env, governance_env, rlgw, statuses


@pytest.fixture(scope="module")
def env(make_database, vllm_url, tiny_model_dir, tmp_path_factory) -> Iterator[Env]:
    yield from governance_env(make_database, vllm_url, tiny_model_dir, tmp_path_factory)


def test_a_tenant_without_consent_is_never_consumed_while_another_tenant_is(env):
    reply = env.admin.put("/admin/tenants/globex/training-policy", json={"models": "none"})
    assert reply.status_code == 200 and reply.json()["source"] == "tenant", reply.text
    default = env.admin.get("/admin/tenants/acme/training-policy").json()
    assert (default["models"], default["source"]) == ("all", "default")
    acme = [env.episode("acme", r) for r in (1.0, 0.0)]
    globex = [env.episode("globex", r) for r in (1.0, 0.5)]

    with env.trainer() as trainer:
        report = trainer.step()
        assert report is not None and report.sessions == 2
        assert trainer.step() is None  # globex's sessions are not claimable
    assert statuses(env, acme) == {"consumed"} and statuses(env, globex) == {"closed"}
    ledger = env.rows("SELECT version, session_id, tenant FROM consumption")
    assert {(s, t) for _, s, t in ledger} == {(s, "acme") for s in acme}

    # Consent given later applies to the sessions not consumed yet.
    reply = env.admin.put("/admin/tenants/globex/training-policy", json={"models": [MODEL_NAME]})
    assert reply.json()["models"] == [MODEL_NAME]
    with env.trainer() as trainer:
        report = trainer.step()
    assert report is not None and report.sessions == 2 and statuses(env, globex) == {"consumed"}
    assert {t for _, s, t in env.rows("SELECT version, session_id, tenant FROM consumption")} == {
        "acme",
        "globex",
    }
    audit = env.admin.get("/admin/audit", params={"tenant": "globex"}).json()
    assert [e["action"] for e in audit] == ["training_policy", "training_policy"]
    assert audit[0]["detail"] == {"models": [MODEL_NAME]} and audit[0]["actor"].startswith(
        "admin-api@"
    )


def test_the_export_shows_the_tenant_and_the_versions_that_consumed_a_session(env):
    (session_id, version) = env.rows(
        "SELECT session_id, version FROM consumption WHERE tenant = 'acme' AND used LIMIT 1"
    )[0]
    with env.agent("acme") as http:
        trajectory = http.get(f"/v1/sessions/{session_id}/trajectory").json()
    assert trajectory["tenant"] == "acme"
    assert trajectory["trained_into"] == [
        {"model": MODEL_NAME, "version": version, "completions": 1}
    ]
    out = io.StringIO()
    with sync_session_factory(env.engine)() as db:
        write_jsonl(db, [session_id], out)
    exported = json.loads(out.getvalue())
    assert (exported["tenant"], exported["trained_into"]) == ("acme", trajectory["trained_into"])


def tenant_rows(env: Env, tenant: str) -> dict[str, set[tuple]]:
    q = "SELECT {} FROM {} WHERE {}"
    scope = "session_id IN (SELECT id FROM sessions WHERE tenant = :t)"
    return {
        "sessions": set(env.rows(q.format("id, status", "sessions", "tenant = :t"), t=tenant)),
        "completions": set(env.rows(q.format("id", "completions", scope), t=tenant)),
        "rewards": set(env.rows(q.format("id", "rewards", scope), t=tenant)),
        "groups": set(env.rows(q.format("id", "groups", "tenant = :t"), t=tenant)),
        "ledger": set(
            env.rows(
                q.format("id, session_id, completion_id, tokens", "consumption", "tenant = :t"),
                t=tenant,
            )
        ),
    }


def test_a_purge_removes_everything_of_a_tenant_and_nothing_of_another(env):
    waiting = env.episode("acme", 1.0)  # closed and rewarded: waiting for a claim
    still_open = env.episode("acme", None, close=False, group_id="acme-group", group_size=2)
    env.episode("globex", 0.5, group_id="globex-group", group_size=1)
    other_before = tenant_rows(env, "globex")
    before = tenant_rows(env, "acme")
    assert {waiting, still_open} <= {s for s, _ in before["sessions"]} and before["ledger"]

    reply = env.admin.delete("/admin/tenants/acme/data")
    assert reply.status_code == 200, reply.text
    purged = reply.json()
    assert (purged["sessions"], purged["completions"], purged["rewards"], purged["groups"]) == (
        len(before["sessions"]),
        len(before["completions"]),
        len(before["rewards"]),
        1,
    )
    trained = {(t["model"], t["version"]) for t in purged["trained_into"]}
    assert trained == set(
        env.rows("SELECT DISTINCT 'tiny', version FROM consumption WHERE tenant = 'acme' AND used")
    )
    after = tenant_rows(env, "acme")
    assert after["sessions"] == after["completions"] == after["rewards"] == after["groups"] == set()
    # The ledger keeps the tenant and the counts, without the deleted ids.
    assert {(i, tokens) for i, _, _, tokens in after["ledger"]} == {
        (i, t) for i, _, _, t in before["ledger"]
    }
    assert {(s, c) for _, s, c, _ in after["ledger"]} == {(None, None)}
    assert tenant_rows(env, "globex") == other_before
    (event,) = env.admin.get("/admin/audit", params={"tenant": "acme"}).json()[:1]
    assert event["action"] == "purge" and event["detail"]["sessions"] == len(before["sessions"])
    with env.agent("acme") as http:
        assert http.get(f"/v1/sessions/{waiting}").status_code == 404


def test_a_purge_is_refused_while_an_update_holds_a_claim_of_the_tenant(env):
    session_id = env.episode("initech", 1.0)
    engine = make_sync_engine(env.db_url)
    instance = TrainerInstance(engine)
    try:
        with sync_session_factory(engine)() as db, db.begin():
            claim = claim_sessions(
                db,
                model=MODEL_NAME,
                instance_id=instance.id,
                max_sessions=8,
                reward_deadline_s=3600,
                now=datetime.now(UTC),
            )
        assert session_id in claim.session_ids
        reply = env.admin.delete("/admin/tenants/initech/data")
        assert reply.status_code == 409 and reply.json()["error"]["code"] == "claim_in_progress"
        assert statuses(env, [session_id]) == {"claimed"}  # nothing was deleted
        with sync_session_factory(engine)() as db, db.begin():
            unclaim(db, claim.session_ids, instance.id)
    finally:
        instance.close()
        engine.dispose()
    reply = env.admin.delete("/admin/tenants/initech/data")
    assert reply.status_code == 200 and reply.json()["sessions"] == 1


def test_bad_input_to_the_governance_api_is_a_clear_4xx(env):
    cases = [
        (
            "put",
            "/admin/tenants/acme/training-policy",
            {"models": ["no-such-model"]},
            400,
            "model_not_found",
        ),
        ("put", "/admin/tenants/acme/training-policy", {"models": "some"}, 422, None),
        ("get", "/admin/tenants/-bad-/training-policy", None, 422, None),
        ("post", "/admin/models/no-such-model/rollback", {"to": 0}, 404, "model_not_found"),
        ("post", f"/admin/models/{MODEL_NAME}/rollback", {"to": 9999}, 404, "version_not_found"),
        ("post", f"/admin/models/{MODEL_NAME}/rollback", {"to": -1}, 422, None),
        ("get", "/admin/models/no-such-model/gate", None, 404, "model_not_found"),
    ]
    for method, path, body, status, code in cases:
        reply = env.admin.request(method, path, json=body)
        assert reply.status_code == status, (path, body, reply.text)
        if code:
            assert reply.json()["error"]["code"] == code


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (("rollback", "--model", "no-such-model", "--to", "0"), "no model named 'no-such-model'"),
        (("rollback", "--model", MODEL_NAME, "--to", "9999"), "has no version 9999"),
        (
            ("gate", "set", "--model", "no-such-model", "--eval", "copy4", "--min-score", "0.5"),
            "no model named",
        ),
        (
            (
                "gate",
                "set",
                "--model",
                MODEL_NAME,
                "--eval",
                "/nonexistent.jsonl",
                "--min-score",
                "0.5",
            ),
            "cannot read",
        ),
        (
            (
                "gate",
                "set",
                "--model",
                MODEL_NAME,
                "--eval",
                "copy4",
                "--min-score",
                "0.5",
                "--max-drop",
                "0.1",
            ),
            "exactly one",
        ),
        (
            (
                "gate",
                "set",
                "--model",
                MODEL_NAME,
                "--eval",
                "copy4",
                "--max-drop",
                "0",
                "--canary",
                "sessions:0",
            ),
            "0 < PCT <= 100",
        ),
        (
            (
                "gate",
                "set",
                "--model",
                MODEL_NAME,
                "--eval",
                "copy4",
                "--max-drop",
                "0",
                "--canary",
                "backend",
            ),
            "needs two backends",
        ),
        (("retention", "sweep", "--text-days", "-1"), "cannot be negative"),
    ],
)
def test_bad_input_to_the_governance_commands_is_one_line_and_exit_2(env, capsys, argv, says):
    code, out, err = rlgw(env, *argv, capsys=capsys)
    assert code == 2 and out == "", (code, out, err)
    assert len(err.strip().splitlines()) == 1 and says in err, err


def test_retention_drops_old_texts_keeps_their_tokens_then_drops_old_records(env, capsys):
    old, recent = env.episode("hooli", 1.0), env.episode("hooli", 1.0)
    with env.engine.begin() as conn:  # the first one is 40 days old
        conn.execute(
            text("UPDATE sessions SET created_at = now() - interval '40 days' WHERE id = :id"),
            {"id": old},
        )
        conn.execute(
            text(
                "UPDATE completions SET created_at = now() - interval '40 days' "
                "WHERE session_id = :id"
            ),
            {"id": old},
        )
    tokens_before = env.rows(
        "SELECT output_token_ids, output_logprobs FROM completions WHERE session_id = :id", id=old
    )

    code, out, err = rlgw(env, "retention", "sweep", "--text-days", "30", capsys=capsys)
    assert code == 0 and json.loads(out)["texts_dropped"] >= 1, err
    ((request, response, dropped),) = env.rows(
        "SELECT request::text, response::text, text_dropped_at FROM completions "
        "WHERE session_id = :id",
        id=old,
    )
    assert (request, response) == ("{}", None) and dropped is not None
    assert (
        env.rows(
            "SELECT output_token_ids, output_logprobs FROM completions WHERE session_id = :id",
            id=old,
        )
        == tokens_before
    )
    ((recent_request,),) = env.rows(
        "SELECT request::text FROM completions WHERE session_id = :id", id=recent
    )
    assert "Say A" in recent_request
    with env.agent("hooli") as http:  # the trajectory still has every token to train on
        steps = http.get(f"/v1/sessions/{old}/trajectory").json()["steps"]
    assert steps[0]["output_token_ids"] and steps[0]["response"] is None

    code, out, err = rlgw(env, "retention", "sweep", "--records-days", "35", capsys=capsys)
    assert code == 0 and json.loads(out)["sessions_deleted"] >= 1, err
    assert env.rows("SELECT id FROM sessions WHERE id IN (:a, :b)", a=old, b=recent) == [(recent,)]
    (event,) = env.admin.get("/admin/audit", params={"limit": 1}).json()
    assert event["action"] == "retention" and event["detail"]["sessions_deleted"] >= 1


def test_the_gateway_sweeps_by_itself_when_retention_is_set(env):
    old = env.episode("umbrella", 1.0)
    with env.engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE completions SET created_at = now() - interval '3 days' "
                "WHERE session_id = :id"
            ),
            {"id": old},
        )
    settings = gateway_settings(
        env.db_url,
        auth="on",
        token_secret=TOKEN_SECRET,
        retention_text_days=1.0,
        retention_sweep_s=0.2,
    )
    with LiveServer(create_app(settings), free_port()):
        deadline = datetime.now(UTC).timestamp() + 20
        while datetime.now(UTC).timestamp() < deadline:
            if env.rows(
                "SELECT 1 FROM completions WHERE session_id = :id AND text_dropped_at IS NOT NULL",
                id=old,
            ):
                break
    assert env.rows("SELECT request::text FROM completions WHERE session_id = :id", id=old) == [
        ("{}",)
    ]
