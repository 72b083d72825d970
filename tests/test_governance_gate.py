"""Promotion gates, canaries and rollbacks on two live vLLM CPU backends behind a gateway, with
the online trainer: a version that scores worse on its held-out evaluation is refused and every
later request stays on the promoted version; one that passes serves everywhere; a canary session
never mixes versions, and the canary's live rewards promote or reject the candidate; a rollback
to version 0 serves the base weights bit for bit, from the command line or the admin API, and
training continues from there under a new number."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text

from gateway.main import create_app
from migrations.runner import upgrade
from rlgw.db.engine import make_sync_engine, sync_session_factory
from rlgw.registry import register_backend
from rlgw_cli.main import main as rlgw_main
from trainer.backends.parity import reference_scores, served_scores
from trainer.backends.vllm_control import VllmControl
from trainer.config import TrainerConfig
from trainer.loop.service import OnlineTrainer
from trainer.models.weights import load_reference_model

from conftest import (
    ADMIN_KEY,
    MODEL_NAME,
    LiveServer,
    free_port,
    gateway_settings,
    start_vllm_servers,
    stop_vllm_servers,
)
from swap_helpers import random_delta, write_delta

PROMPTS = ["Copy: kxqm", "Copy: abcd", "Copy: zzyx", "Copy: hello"]


class Stack:
    def __init__(self, db_url: str, backends: list[str], gateway: str, home: Path, model_dir: Path):
        self.db_url, self.backends, self.gateway, self.model_dir = (
            db_url,
            backends,
            gateway,
            model_dir,
        )
        self.settings = gateway_settings(db_url).model_copy(
            update={"home": home, "public_url": gateway}
        )
        self.engine = create_engine(db_url)
        self.http = httpx.Client(base_url=gateway, timeout=120)
        self.admin = httpx.Client(base_url=gateway, timeout=60, headers={"X-Admin-Key": ADMIN_KEY})
        self.base_checksums = self.checksums()

    def checksums(self) -> list[str]:
        control = httpx.Client(timeout=120)
        return [VllmControl(control, url).rpc("rlgw_checksum") for url in self.backends]

    def rows(self, sql: str, **params) -> list[tuple]:
        with self.engine.connect() as conn:
            return [tuple(r) for r in conn.execute(text(sql), params)]

    def served_versions(self) -> list[int]:
        return [v for (v,) in self.rows("SELECT served_version FROM backends ORDER BY id")]

    def current(self) -> tuple[int, int | None]:
        return self.rows("SELECT current_version, candidate_version FROM models")[0]

    def version(self, v: int) -> tuple[str, dict, int]:
        return self.rows(
            "SELECT status, gate_report, parent_version FROM policy_versions WHERE version = :v",
            v=v,
        )[0]

    def trainer(self, **config) -> OnlineTrainer:
        return OnlineTrainer(
            self.settings,
            make_sync_engine(self.db_url),
            MODEL_NAME,
            TrainerConfig(**{"batch_sessions": 32, **config}),
            log=print,
        )

    def turn(self, session_id: str, messages: list[dict]) -> httpx.Response:
        body = {"model": MODEL_NAME, "messages": messages, "max_tokens": 4, "temperature": 1.0}
        return self.http.post(f"/sessions/{session_id}/v1/chat/completions", json=body)

    def episode(self, reward: float | None) -> str:
        """A closed, rewarded session of one completion; reward None: +1 for an answer that is
        not only whitespace, -1 for one that is (what the tiny model says when untrained)."""
        session_id = self.http.post("/v1/sessions", json={}).json()["id"]
        reply = self.turn(session_id, [{"role": "user", "content": "Say A"}])
        assert reply.status_code == 200, reply.text
        if reward is None:
            reward = 1.0 if reply.json()["choices"][0]["message"]["content"].strip() else -1.0
        reply = self.http.post(f"/v1/sessions/{session_id}/rewards", json={"value": reward})
        assert reply.status_code == 201, reply.text
        self.http.post(f"/v1/sessions/{session_id}/close")
        return session_id

    def session_versions(self, session_id: str) -> set[int]:
        sql = "SELECT policy_version FROM completions WHERE session_id = :s AND status = 'complete'"
        return {v for (v,) in self.rows(sql, s=session_id)}

    def rlgw(self, capsys, *argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("RLGW_DATABASE_URL", self.db_url)
            mp.setenv("RLGW_HOME", str(self.settings.home))
            with pytest.raises(SystemExit) as exited:
                rlgw_main(list(argv))
        out, err = capsys.readouterr()
        return exited.value.code, out, err


@pytest.fixture(scope="module")
def stack(make_database, tiny_model_dir, tmp_path_factory) -> Iterator[Stack]:
    db_url = make_database()
    upgrade(db_url)
    servers = start_vllm_servers(tiny_model_dir, tmp_path_factory.mktemp("gate-logs"), count=2)
    engine = make_sync_engine(db_url)
    for _, url in servers:
        register_backend(
            sync_session_factory(engine), MODEL_NAME, url, model_path=str(tiny_model_dir)
        )
    engine.dispose()
    with LiveServer(create_app(gateway_settings(db_url)), free_port()) as gw:
        yield Stack(
            db_url,
            [url for _, url in servers],
            gw.url,
            tmp_path_factory.mktemp("home"),
            tiny_model_dir,
        )
    stop_vllm_servers(servers)


def greedy_eval(stack: Stack, path: Path) -> Path:
    """An evaluation the served model passes exactly: its own greedy answers are the targets (the
    untrained tiny model answers only newlines)."""
    lines = []
    for prompt in PROMPTS:
        messages = [{"role": "user", "content": prompt}]
        reply = httpx.post(
            f"{stack.backends[0]}/v1/chat/completions",
            json={"model": MODEL_NAME, "messages": messages, "max_tokens": 6, "temperature": 0.0},
            timeout=120,
        ).json()
        answer = reply["choices"][0]["message"]["content"]
        lines.append(json.dumps({"messages": messages, "target": answer, "max_tokens": 6}))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_gated_version_that_scores_worse_is_refused_and_traffic_stays_on_the_promoted_one(
    stack, capsys, tmp_path
):
    code, _, err = stack.rlgw(
        capsys,
        "gate",
        "set",
        "--model",
        MODEL_NAME,
        "--eval",
        str(greedy_eval(stack, tmp_path / "e.jsonl")),
        "--min-score",
        "0.75",
    )
    assert code == 0, err
    for _ in range(6):
        stack.episode(None)  # penalize the newlines the base model answers with
    trainer = stack.trainer(lr=0.5)  # one step this large changes every greedy answer
    try:
        report = trainer.step()
        assert report is not None and report.metrics["gate"] == "rejected"
        rejected = report.version
        status, gate_report, parent = stack.version(rejected)
        assert (status, parent) == ("rejected", 0)
        assert gate_report["eval"]["score"] < 0.75 and "below 0.75" in gate_report["reason"]
        assert stack.current() == (0, None)
        # The backend that held the candidate got version 0 back, through the verified swap.
        assert stack.served_versions() == [0, 0] and stack.checksums() == stack.base_checksums
        # The evaluation ran through the gateway on train:false sessions served by the candidate.
        evaluated = stack.rows(
            "SELECT s.train, s.tenant, c.policy_version FROM sessions s JOIN completions c "
            "ON c.session_id = s.id WHERE s.id = ANY(:ids)",
            ids=gate_report["eval"]["sessions"],
        )
        assert set(evaluated) == {(False, "rlgw-gate", rejected)} and len(evaluated) == len(PROMPTS)
        # The trainer continues from the promoted version's weights.
        assert trainer.version == 0
        base = reference_scores(load_reference_model(stack.model_dir))
        assert reference_scores(trainer.model).max_abs_diff(base) == 0.0
    finally:
        trainer.close()
    later = [stack.episode(1.0) for _ in range(4)]
    assert {v for s in later for v in stack.session_versions(s)} == {0}
    created = stack.rows("SELECT created_at FROM policy_versions WHERE version = :v", v=rejected)[
        0
    ][0]
    served_since = stack.rows(
        "SELECT DISTINCT c.policy_version FROM completions c "
        "JOIN sessions s ON s.id = c.session_id "
        "WHERE c.created_at > :t AND s.pinned_version IS NULL",
        t=created,
    )
    assert served_since == [(0,)]


def test_a_version_that_passes_its_gate_is_promoted_on_every_backend(stack, capsys, tmp_path):
    code, _, err = stack.rlgw(
        capsys,
        "gate",
        "set",
        "--model",
        MODEL_NAME,
        "--eval",
        str(greedy_eval(stack, tmp_path / "e.jsonl")),
        "--max-drop",
        "1.0",
    )
    assert code == 0, err
    stack.episode(1.0)
    trainer = stack.trainer()
    try:
        report = trainer.step()
    finally:
        trainer.close()
    assert report is not None and report.metrics["gate"] == "promoted"
    status, gate_report, parent = stack.version(report.version)
    assert status == "promoted" and gate_report["eval"]["baseline"] is not None
    assert stack.current() == (report.version, None)
    assert stack.served_versions() == [report.version, report.version]
    assert stack.version(0)[1]["scores"]  # the baseline's score is kept on version 0
    assert stack.session_versions(stack.episode(1.0)) == {report.version}


def canary_sessions(stack: Stack, candidate: int, each: int) -> tuple[list[str], list[str]]:
    """Open sessions until `each` are pinned to the candidate and `each` are not; every one has
    made one completion."""
    pinned, unpinned = [], []
    for _ in range(60):
        if len(pinned) >= each and len(unpinned) >= each:
            break
        session_id = stack.http.post("/v1/sessions", json={}).json()["id"]
        assert stack.turn(session_id, [{"role": "user", "content": "Say A"}]).status_code == 200
        (pin,) = stack.rows("SELECT pinned_version FROM sessions WHERE id = :s", s=session_id)[0]
        (pinned if pin == candidate else unpinned).append(session_id)
        assert pin in (candidate, None)
    return pinned, unpinned


def close_with(stack: Stack, session_ids: list[str], reward: float) -> None:
    for session_id in session_ids:
        stack.http.post(f"/v1/sessions/{session_id}/rewards", json={"value": reward})
        stack.http.post(f"/v1/sessions/{session_id}/close")


def start_canary(stack: Stack, capsys, tmp_path) -> tuple[OnlineTrainer, int, int]:
    code, _, err = stack.rlgw(
        capsys,
        "gate",
        "set",
        "--model",
        MODEL_NAME,
        "--eval",
        str(greedy_eval(stack, tmp_path / "e.jsonl")),
        "--max-drop",
        "1.0",
        "--canary",
        "sessions:50",
        "--canary-sessions",
        "2",
        "--canary-max-drop",
        "0.1",
    )
    assert code == 0, err
    promoted = stack.current()[0]
    stack.episode(1.0)
    trainer = stack.trainer()
    report = trainer.step()
    assert report is not None and report.metrics["gate"] == "canary"
    assert stack.current() == (promoted, report.version)
    assert sorted(stack.served_versions()) == sorted([promoted, report.version])
    return trainer, promoted, report.version


def test_a_canary_session_never_mixes_versions_and_worse_rewards_roll_the_canary_back(
    stack, capsys, tmp_path
):
    trainer, promoted, candidate = start_canary(stack, capsys, tmp_path)
    try:
        pinned, unpinned = canary_sessions(stack, candidate, each=3)
        for session_id in pinned + unpinned:  # a second turn each
            assert stack.turn(session_id, [{"role": "user", "content": "again"}]).status_code == 200
        assert all(stack.session_versions(s) == {candidate} for s in pinned)
        assert all(stack.session_versions(s) == {promoted} for s in unpinned)
        live = stack.admin.get(f"/admin/models/{MODEL_NAME}/gate").json()["canary"]
        assert live["candidate"] == candidate and live["canary_sessions"] == 0
        close_with(stack, pinned[:2], 0.0)
        close_with(stack, unpinned[:2], 1.0)
        still_open = pinned[2:] + unpinned[2:]  # at least one of each
        assert trainer.governor.tick()  # judged: worse by more than 0.1
        status, gate_report, _ = stack.version(candidate)
        assert status == "rejected" and gate_report["canary_metrics"]["canary_mean"] == 0.0
        assert stack.current() == (promoted, None)
        assert stack.served_versions() == [promoted, promoted]
    finally:
        trainer.close()
    for session_id in still_open:
        reply = stack.turn(session_id, [{"role": "user", "content": "more"}])
        if session_id in pinned:  # its version no longer serves: refused, never served by another
            assert reply.status_code == 409
            assert reply.json()["error"]["code"] == "pinned_version_retired"
            assert stack.session_versions(session_id) == {candidate}
        else:
            assert reply.status_code == 200 and stack.session_versions(session_id) == {promoted}


def test_a_canary_that_keeps_up_is_promoted_and_its_sessions_stay_on_it(stack, capsys, tmp_path):
    trainer, promoted, candidate = start_canary(stack, capsys, tmp_path)
    try:
        pinned, unpinned = canary_sessions(stack, candidate, each=3)
        close_with(stack, pinned[:2], 1.0)
        close_with(stack, unpinned[:2], 1.0)
        assert trainer.governor.tick()
        assert stack.version(candidate)[0] == "promoted" and stack.current() == (candidate, None)
        assert stack.served_versions() == [candidate, candidate]
    finally:
        trainer.close()
    session_id = pinned[2]  # still open: its next turn comes from the same version
    assert stack.turn(session_id, [{"role": "user", "content": "more"}]).status_code == 200
    assert stack.session_versions(session_id) == {candidate}


def test_a_push_past_a_promotion_gate_is_refused_and_records_nothing(stack, capsys, tmp_path):
    assert stack.rows("SELECT count(*) FROM gates") == [(1,)]
    newest = stack.rows("SELECT max(version) FROM policy_versions")
    delta = write_delta(random_delta(stack.model_dir, 31), tmp_path / "delta.safetensors")
    code, _, err = stack.rlgw(capsys, "push", "--model", MODEL_NAME, "--delta", str(delta))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "promotion gate" in err, err
    assert stack.rows("SELECT max(version) FROM policy_versions") == newest


def test_a_rollback_to_version_0_serves_the_base_weights_bit_for_bit(stack, capsys):
    assert stack.rlgw(capsys, "gate", "clear", "--model", MODEL_NAME)[0] == 0
    before = stack.current()[0]
    assert before > 0 and stack.checksums() != stack.base_checksums
    code, _, err = stack.rlgw(
        capsys, "rollback", "--model", MODEL_NAME, "--to", "0", "--reason", "regressed on review"
    )
    assert code == 0, err
    assert stack.checksums() == stack.base_checksums  # the worker's sha256 of every parameter
    base = reference_scores(load_reference_model(stack.model_dir))
    control = httpx.Client(timeout=120)
    for url in stack.backends:
        assert served_scores(control, url, MODEL_NAME).max_abs_diff(base) <= 1e-4
        assert VllmControl(control, url).weight_version() == "0"
    assert stack.current() == (0, None) and stack.served_versions() == [0, 0]
    assert stack.version(before)[0] == "rolled_back"
    (event,) = stack.rows(
        "SELECT actor, reason, from_version, to_version, state FROM audit_log "
        "WHERE action = 'rollback' ORDER BY id DESC LIMIT 1"
    )
    assert event[0].startswith("os:") and event[1:] == ("regressed on review", before, 0, "done")
    newest = stack.rows("SELECT max(version) FROM policy_versions")[0][0]
    # Training continues from version 0, under a new number.
    stack.episode(1.0)
    trainer = stack.trainer()
    try:
        assert trainer.version == 0
        report = trainer.step()
    finally:
        trainer.close()
    assert report.version == newest + 1 and stack.version(report.version)[2] == 0
    assert stack.served_versions() == [report.version, report.version]


def test_a_rollback_asked_for_over_the_api_is_carried_out_by_the_trainer(stack):
    before = stack.current()[0]
    trainer = stack.trainer()
    try:
        reply = stack.admin.post(
            f"/admin/models/{MODEL_NAME}/rollback",
            json={"to": 0, "reason": "api test", "actor": "alice"},
        )
        assert reply.status_code == 202, reply.text
        request = reply.json()
        assert (request["state"], request["from_version"], request["to_version"]) == (
            "pending",
            before,
            0,
        )
        assert request["actor"].endswith(" as alice")
        assert trainer.step() is None  # it carried out the rollback; nothing to train
        assert trainer.version == 0
    finally:
        trainer.close()
    (listed,) = [
        r
        for r in stack.admin.get(f"/admin/models/{MODEL_NAME}/rollbacks").json()
        if r["id"] == request["id"]
    ]
    assert listed["state"] == "done" and set(listed["detail"]["swaps"].values()) == {"swapped"}
    assert stack.checksums() == stack.base_checksums
