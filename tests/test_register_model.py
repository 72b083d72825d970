"""POST /register_model and `rlgw register`: SSRF attempts are refused (negative cases first),
redirects are not followed, DNS is resolved once and pinned, re-registering is explicit, and a
real vLLM server registers and serves."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import httpx
import pytest
from sqlalchemy import create_engine, text

import rlgw.netguard
from migrations.runner import upgrade
from rlgw_cli import main as rlgw_main

from auth_helpers import as_key, auth_gateway, mint_key
from conftest import ADMIN_KEY, MODEL_NAME
from fakes import fake_vllm


@pytest.fixture(scope="module")
def db_url(make_database: Callable[[], str]) -> str:
    url = make_database()
    upgrade(url)
    return url


@contextmanager
def admin_client(gw: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gw, timeout=60, headers={"X-Admin-Key": ADMIN_KEY}) as client:
        yield client


@pytest.fixture(scope="module")
def admin(db_url: str) -> Iterator[httpx.Client]:
    with auth_gateway(db_url) as gw, admin_client(gw) as client:
        yield client


def register(admin: httpx.Client, name: str, *urls: str, **extra) -> httpx.Response:
    return admin.post("/register_model", json={"name": name, "backends": list(urls), **extra})


def backends_of(db_url: str, model: str) -> dict[str, str]:
    engine = create_engine(db_url)
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT b.url, b.state FROM backends b JOIN models m ON m.id = b.model_id "
                "WHERE m.name = :m"
            ),
            {"m": model},
        ).all()
    engine.dispose()
    return dict(rows)


# ----------------------------------------------------------------------------- refused


def test_admin_key_is_required(admin):
    body = {"name": "m", "backends": ["http://127.0.0.1:9"]}
    with httpx.Client(base_url=str(admin.base_url), timeout=30) as anonymous:
        assert anonymous.post("/register_model", json=body).status_code == 401
        wrong = anonymous.post("/register_model", json=body, headers={"X-Admin-Key": "nope"})
        assert wrong.status_code == 403


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data/",
        "http://[::ffff:169.254.169.254]/",
        "http://2852039166/",
        "http://0251.0376.0251.0376/",
        "http://0xa9fea9fe/",
        "http://0.0.0.0:8000",
        "http://[::]:8000",
        "http://[fe80::1]:8000",
        "http://[fd00::1]:8000",
        "http://10.0.0.5:8000",
        "http://127.1:8000",
        "ftp://127.0.0.1/",
        "file:///etc/passwd",
        "gopher://127.0.0.1:6379/_FLUSHALL",
        "http://127.0.0.1:8000/?x=1",
    ],
)
def test_ssrf_targets_are_refused_before_any_request(admin, url):
    reply = register(admin, "victim", url)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["code"] == "backend_not_allowed"
    assert reply.json()["error"]["param"] == "backends.0"


def test_credentials_in_the_url_are_refused_and_never_echoed(admin):
    reply = register(admin, "victim", "http://root:hunter2-secret@127.0.0.1:8000")
    assert reply.status_code == 400
    assert "hunter2-secret" not in reply.text and "root" not in reply.text


def test_a_name_resolving_to_a_private_address_is_refused(admin, monkeypatch):
    monkeypatch.setattr(rlgw.netguard, "resolve_host", lambda host, port: ["10.9.8.7"])
    reply = register(admin, "victim", "http://internal.example:8000")
    assert reply.status_code == 400
    assert "10.9.8.7 is not in RLGW_BACKEND_ALLOWLIST" in reply.json()["error"]["message"]
    monkeypatch.setattr(rlgw.netguard, "resolve_host", lambda host, port: ["169.254.169.254"])
    assert register(admin, "victim", "http://metadata.example").status_code == 400


def test_localhost_aliases_are_refused_when_loopback_is_not_allowlisted(db_url):
    with (
        fake_vllm() as server,
        auth_gateway(db_url, backend_allowlist="10.0.0.0/8") as gw,
        admin_client(gw) as admin,
    ):
        for url in (
            server.url,
            f"http://localhost:{server.port}",
            f"http://[::ffff:127.0.0.1]:{server.port}",
            f"http://[::1]:{server.port}",
        ):
            reply = register(admin, "fake", url)
            assert reply.status_code == 400, url
        assert server.requests == []


def test_redirects_are_not_followed(admin):
    with fake_vllm() as target:
        for where in (f"{target.url}/v1/models", "http://169.254.169.254/latest/meta-data/"):
            with fake_vllm(redirect_to=where) as redirector:
                reply = register(admin, "fake", redirector.url)
                assert reply.status_code == 422, reply.text
                assert "redirects are not followed" in reply.json()["error"]["message"]
                assert len(redirector.requests) == 1
        assert target.requests == []  # the redirect target was never contacted


def test_a_server_that_is_not_vllm_of_that_model_is_refused(admin, db_url):
    with fake_vllm(model="something-else") as server:
        reply = register(admin, "fake", server.url)
    assert reply.status_code == 422 and reply.json()["error"]["code"] == "backend_check_failed"
    reply = register(admin, "fake", "http://127.0.0.1:9")  # nothing listens on port 9
    assert reply.status_code == 422
    assert backends_of(db_url, "fake") == {}


# ----------------------------------------------------------------------------- accepted


def test_register_then_conflict_then_explicit_replace(admin, db_url):
    with fake_vllm(model=["fake", "other-model"]) as first, fake_vllm() as second:
        reply = register(admin, "fake", first.url, model_path="/models/fake")
        assert reply.status_code == 201, reply.text
        out = reply.json()
        assert out["backends"][0]["url"] == first.url
        assert out["backends"][0]["served_version"] == 0 and first.label == "0"
        again = register(admin, "fake", second.url)
        assert again.status_code == 409 and again.json()["error"]["code"] == "model_exists"
        assert second.requests == []  # refused before anything was sent
        replaced = register(admin, "fake", second.url, replace=True)
        assert replaced.status_code == 201, replaced.text
        assert backends_of(db_url, "fake") == {first.url: "draining", second.url: "active"}
        # A backend of one model cannot be taken over by another.
        stolen = register(admin, "other-model", first.url)
        assert stolen.status_code == 409, stolen.text
        assert stolen.json()["error"]["code"] == "registration_conflict"
        duplicate = register(admin, "dup", second.url, second.url)
        assert duplicate.status_code == 400


def test_dns_is_resolved_once_and_the_address_pinned(admin, db_url, monkeypatch):
    calls: list[str] = []

    def resolver(host: str, port: int) -> list[str]:
        calls.append(host)
        return ["127.0.0.1"]

    monkeypatch.setattr(rlgw.netguard, "resolve_host", resolver)
    with fake_vllm(model="pinned") as server:
        url = f"http://vllm-alias.test:{server.port}"
        reply = register(admin, "pinned", url)
        assert reply.status_code == 201, reply.text
    assert calls == ["vllm-alias.test"]  # once, for three requests
    assert [r[:2] for r in server.requests] == [
        ("GET", "/v1/models"),
        ("GET", "/weight_info"),
        ("POST", "/update_weight_version"),
    ]
    assert {host for *_, host in server.requests} == {f"vllm-alias.test:{server.port}"}
    assert backends_of(db_url, "pinned") == {url: "active"}  # stored as registered


def test_a_real_vllm_server_registers_and_serves(vllm_url, make_database):
    db_url = make_database()  # a registry of its own: the shared one is untouched
    upgrade(db_url)
    with auth_gateway(db_url) as gw, admin_client(gw) as admin:
        reply = register(admin, MODEL_NAME, vllm_url)
        assert reply.status_code == 201, reply.text
        assert reply.json()["backends"][0]["served_version"] >= 0
        with as_key(gw, mint_key(admin, "t")["key"]) as agent:
            assert agent.get("/v1/models").json()["data"][0]["id"] == MODEL_NAME
            answer = agent.post(
                "/v1/completions", json={"model": MODEL_NAME, "prompt": "hi", "max_tokens": 2}
            )
            assert answer.status_code == 200, answer.text


# ----------------------------------------------------------------------------- the CLI


def test_cli_register_applies_the_same_rules(db_url, monkeypatch, capsys):
    monkeypatch.setenv("RLGW_DATABASE_URL", db_url)

    def run(*argv: str) -> int:
        with pytest.raises(SystemExit) as done:
            rlgw_main(["register", *argv])
        return done.value.code

    assert run("--model", "cli", "--url", "http://169.254.169.254") == 2
    assert "link-local" in capsys.readouterr().err
    with fake_vllm(model="cli") as server:
        monkeypatch.setenv("RLGW_BACKEND_ALLOWLIST", "10.0.0.0/8")
        assert run("--model", "cli", "--url", server.url) == 2
        assert "not in RLGW_BACKEND_ALLOWLIST" in capsys.readouterr().err
        # Outside the allowlist only with the explicit flag; metadata addresses never.
        assert run("--model", "cli", "--url", server.url, "--skip-allowlist") == 0
        assert run("--model", "cli", "--url", "http://169.254.169.254", "--skip-allowlist") == 2
    assert backends_of(db_url, "cli") == {server.url: "active"}
