"""Training consent per agent key: a key narrows (never widens) its tenant's consent; the
sessions a key opened without consent are recorded and served but never consumed, while another
key's of the same tenant are; the ledger records the key (provenance); the admin API and the
CLI set it, and refuse bad input clearly.

Real Postgres and the suite's real vLLM server; the trainer runs with no backend registered, as in
tests/test_governance_data.py (versions are recorded, nothing is swapped)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import httpx
import openai
import pytest

from rlgw import agent_keys
from rlgw.db.engine import sync_session_factory

from conftest import MODEL_NAME
from governance_helpers import Env, governance_env, rlgw, statuses

TENANT = "hooli"
SAY_A = [{"role": "user", "content": "Say A"}]


@pytest.fixture(scope="module")
def env(make_database, vllm_url, tiny_model_dir, tmp_path_factory) -> Iterator[Env]:
    yield from governance_env(make_database, vllm_url, tiny_model_dir, tmp_path_factory)


def mint(env: Env, tenant: str = TENANT) -> tuple[str, str]:
    """A new agent key of `tenant`: (its id, the key)."""
    with sync_session_factory(env.engine)() as db, db.begin():
        row, key = agent_keys.mint(db, tenant)
        return row.id, key


def episode(env: Env, key: str, *, named_on_first_use: bool = False) -> str:
    """A rewarded, closed session of `key` with one completion: created with POST /v1/sessions,
    or (`named_on_first_use`) by the first completion that names it."""
    with httpx.Client(
        base_url=env.gateway, timeout=120, headers={"Authorization": f"Bearer {key}"}
    ) as http:
        if named_on_first_use:
            session_id = f"first-use-{uuid.uuid4().hex[:12]}"
            client = openai.OpenAI(
                base_url=f"{env.gateway}/v1",
                api_key=key,
                default_headers={"X-Session-Id": session_id},
            )
        else:
            session = http.post("/v1/sessions", json={}).json()
            session_id = session["id"]
            client = openai.OpenAI(base_url=session["base_url"], api_key=key)
        client.chat.completions.create(model=MODEL_NAME, messages=SAY_A, max_tokens=4)
        reward = http.post(f"/v1/sessions/{session_id}/rewards", json={"value": 1.0})
        assert reward.status_code == 201, reward.text
        assert http.post(f"/v1/sessions/{session_id}/close").status_code == 200
    return session_id


def put_key_policy(env: Env, key_id: str, models) -> dict:
    reply = env.admin.put(f"/admin/agent_keys/{key_id}/training-policy", json={"models": models})
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_a_key_without_consent_is_never_consumed_while_another_key_of_its_tenant_is(env):
    consenting, consenting_key = mint(env)
    refusing, refusing_key = mint(env)
    shown = put_key_policy(env, refusing, "none")
    assert (shown["models"], shown["effective"], shown["tenant"]) == ("none", "none", TENANT)
    inherited = env.admin.get(f"/admin/agent_keys/{consenting}/training-policy").json()
    assert (inherited["models"], inherited["effective"]) == ("inherit", "all")

    kept = [episode(env, consenting_key), episode(env, consenting_key, named_on_first_use=True)]
    refused = [episode(env, refusing_key), episode(env, refusing_key, named_on_first_use=True)]
    opened_by = dict(
        env.rows("SELECT id, agent_key_id FROM sessions WHERE id = ANY(:ids)", ids=kept + refused)
    )
    assert opened_by == {**dict.fromkeys(kept, consenting), **dict.fromkeys(refused, refusing)}

    with env.trainer() as trainer:
        report = trainer.step()
        assert report is not None and report.sessions == 2
        assert trainer.step() is None  # the refusing key's sessions are not claimable
    assert statuses(env, kept) == {"consumed"} and statuses(env, refused) == {"closed"}
    ledger = env.rows("SELECT session_id, tenant, agent_key_id FROM consumption")
    assert set(ledger) == {(s, TENANT, consenting) for s in kept}

    # The key's consent given later (to this model only) applies to its sessions not consumed yet.
    shown = put_key_policy(env, refusing, [MODEL_NAME])
    assert (shown["models"], shown["effective"]) == ([MODEL_NAME], [MODEL_NAME])
    with env.trainer() as trainer:
        report = trainer.step()
    assert report is not None and report.sessions == 2 and statuses(env, refused) == {"consumed"}
    keys = {k for (k,) in env.rows("SELECT agent_key_id FROM consumption")}
    assert keys == {consenting, refusing}
    audit = env.admin.get("/admin/audit", params={"tenant": TENANT}).json()
    assert [e["action"] for e in audit] == ["key_training_policy", "key_training_policy"]
    assert audit[0]["detail"] == {"agent_key": refusing, "models": [MODEL_NAME]}


def test_a_key_never_widens_its_tenants_consent(env):
    key_id, key = mint(env, "initrode")
    put_key_policy(env, key_id, [MODEL_NAME])
    reply = env.admin.put("/admin/tenants/initrode/training-policy", json={"models": "none"})
    assert reply.status_code == 200, reply.text
    shown = env.admin.get(f"/admin/agent_keys/{key_id}/training-policy").json()
    assert (shown["models"], shown["effective"]) == ([MODEL_NAME], "none")

    session = episode(env, key)
    with env.trainer() as trainer:
        assert trainer.step() is None
    assert statuses(env, [session]) == {"closed"}


def test_bad_input_to_the_key_consent_api_is_a_clear_4xx(env):
    key_id, _ = mint(env)
    missing = "ak_" + "0" * 24
    cases = [
        (f"/admin/agent_keys/{missing}/training-policy", {"models": "none"}, 404),
        (f"/admin/agent_keys/{key_id}/training-policy", {"models": ["no-such-model"]}, 400),
        (f"/admin/agent_keys/{key_id}/training-policy", {"models": "all"}, 422),
        (f"/admin/agent_keys/{key_id}/training-policy", {"models": "some"}, 422),
        ("/admin/agent_keys/not-a-key/training-policy", {"models": "none"}, 422),
    ]
    for path, body, status in cases:
        reply = env.admin.put(path, json=body)
        assert reply.status_code == status, (path, body, reply.text)
        assert "error" in reply.json()
    assert env.admin.get(f"/admin/agent_keys/{missing}/training-policy").json()["error"][
        "code"
    ] == ("agent_key_not_found")
    no_admin = httpx.put(
        f"{env.gateway}/admin/agent_keys/{key_id}/training-policy", json={"models": "none"}
    )
    assert no_admin.status_code == 401


def test_the_keys_command_sets_and_shows_a_keys_consent(env, capsys):
    key_id, _ = mint(env)
    code, out, err = rlgw(env, "keys", "consent", "--id", key_id, "--models", "none", capsys=capsys)
    assert code == 0 and json.loads(out)["effective"] == "none", (out, err)
    code, out, _ = rlgw(env, "keys", "consent", "--id", key_id, capsys=capsys)
    assert code == 0 and json.loads(out)["models"] == "none"
    code, out, _ = rlgw(
        env, "keys", "consent", "--id", key_id, "--models", "inherit", capsys=capsys
    )
    assert code == 0 and json.loads(out)["models"] == "inherit"


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (("--id", "ak_" + "0" * 24, "--models", "none"), "no agent key"),
        (("--models", "no-such-model"), "no model named no-such-model"),
        (("--models", ","), "inherit, none, or model names"),
    ],
)
def test_bad_input_to_the_keys_consent_command_is_one_line_and_exit_2(env, capsys, argv, says):
    if "--id" not in argv:
        argv = ("--id", mint(env)[0], *argv)
    code, out, err = rlgw(env, "keys", "consent", *argv, capsys=capsys)
    assert code == 2 and out == "", (code, out, err)
    assert len(err.strip().splitlines()) == 1 and says in err, err
