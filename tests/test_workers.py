"""`rlgw serve --workers 2`: two processes on one port and one database act as one gateway."""

from __future__ import annotations

from pathlib import Path

import httpx

from migrations.runner import upgrade

from conftest import ADMIN_KEY
from serve_process import processes_seen, serve_process


def test_two_workers_share_the_session_token_secret(make_database, tmp_path: Path):
    url = make_database()
    upgrade(url)
    with serve_process(
        url, workers=2, log_path=tmp_path / "serve.log", RLGW_ADMIN_KEY=ADMIN_KEY, RLGW_AUTH="on"
    ) as gw:
        assert len(processes_seen(gw)) == 2, "both workers should answer"
        admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
        key = httpx.post(f"{gw}/admin/agent_keys", json={"tenant": "t"}, headers=admin).json()
        agent = {"Authorization": f"Bearer {key['key']}"}
        session = httpx.post(f"{gw}/v1/sessions", json={}, headers=agent).json()
        token = httpx.post(f"{gw}/v1/sessions/{session['id']}/token", json={}, headers=agent)
        assert token.status_code == 201, token.text
        bearer = {"Authorization": f"Bearer {token.json()['token']}"}
        # Each call is a new connection and both workers accept connections, so the token minted
        # by one worker is checked by the other too (with a secret per worker, about half of
        # these would be 401).
        for _ in range(40):
            reply = httpx.get(f"{gw}/sessions/{session['id']}/v1/models", headers=bearer)
            assert reply.status_code == 200, reply.text
