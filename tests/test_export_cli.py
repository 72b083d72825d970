"""`rlgw export` writes the same trajectories the API serves, one JSON line per session."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import httpx
import openai
import pytest

from rlgw.export import export_command
from rlgw_cli import main

from conftest import MODEL_NAME


@pytest.fixture(scope="module")
def two_sessions(gateway_url: str) -> tuple[str, list[str]]:
    group_id = f"export-{datetime.now().timestamp()}"
    ids = []
    with httpx.Client(base_url=gateway_url, timeout=60) as http:
        for value in (1.0, 0.0):
            session = http.post("/v1/sessions", json={"group_id": group_id}).json()
            openai.OpenAI(base_url=session["base_url"], api_key="unused").chat.completions.create(
                model=MODEL_NAME, max_tokens=3, messages=[{"role": "user", "content": "x"}]
            )
            http.post(f"/v1/sessions/{session['id']}/rewards", json={"value": value})
            http.post(f"/v1/sessions/{session['id']}/close")
            ids.append(session["id"])
    return group_id, ids


def read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_export_of_a_group_equals_the_api_trajectories(
    two_sessions, database_url, gateway_url, tmp_path
):
    group_id, ids = two_sessions
    out = tmp_path / "group.jsonl"
    export_command(database_url, session_id=None, group_id=group_id, since=None, out_path=str(out))
    lines = read_jsonl(out)
    with httpx.Client(base_url=gateway_url) as http:
        api = [http.get(f"/v1/sessions/{sid}/trajectory").json() for sid in ids]
    assert [line["session_id"] for line in lines] == ids
    assert lines == api


def test_export_of_one_session(two_sessions, database_url, tmp_path):
    out = tmp_path / "one.jsonl"
    export_command(
        database_url, session_id=two_sessions[1][0], group_id=None, since=None, out_path=str(out)
    )
    (line,) = read_jsonl(out)
    assert line["session_id"] == two_sessions[1][0]
    assert line["steps"] and line["steps"][0]["output_token_ids"]


def test_export_since_a_time_includes_recent_sessions_only(two_sessions, database_url, tmp_path):
    out = tmp_path / "since.jsonl"
    future = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    export_command(database_url, session_id=None, group_id=None, since=future, out_path=str(out))
    assert read_jsonl(out) == []
    past = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    export_command(database_url, session_id=None, group_id=None, since=past, out_path=str(out))
    assert set(two_sessions[1]) <= {line["session_id"] for line in read_jsonl(out)}


def test_the_command_line_exports_a_session_and_refuses_bad_selectors(
    two_sessions, database_url, tmp_path, monkeypatch, capsys
):
    """Through `rlgw export` itself: a named session is written; an unknown one and a bad time
    are errors with a message, not an empty file and exit 0, nor a traceback."""
    monkeypatch.setenv("RLGW_DATABASE_URL", database_url)
    out = tmp_path / "cli.jsonl"
    with pytest.raises(SystemExit) as done:
        main(["export", "--session", two_sessions[1][0], "--out", str(out)])
    assert done.value.code == 0
    assert [line["session_id"] for line in read_jsonl(out)] == [two_sessions[1][0]]

    with pytest.raises(SystemExit) as unknown:
        main(["export", "--session", "no-such-session", "--out", str(out)])
    assert unknown.value.code == 1
    assert "no session 'no-such-session'" in capsys.readouterr().err

    with pytest.raises(SystemExit) as bad_time:
        main(["export", "--since", "last tuesday"])
    assert bad_time.value.code == 2
    err = capsys.readouterr().err
    assert "not an ISO 8601 time" in err and "Traceback" not in err
