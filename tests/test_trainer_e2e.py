"""The online trainer end to end: rewarded sessions -> one update -> a verified swap -> new
completions carry the new version; the ledger lists exactly what was used, once, even across a
crash; stale data is skipped with a reason; a push that no backend took (refused, or none
registered) leaves versions that the next push and the next training step build on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import torch
from sqlalchemy import create_engine, select, text
from sqlalchemy.orm import Session

from gateway.main import create_app
from migrations.runner import upgrade
from rlgw.db.engine import make_sync_engine, sync_session_factory
from rlgw.db.models import AgentSession, Consumption, PolicyVersion
from rlgw.registry import register_backend
from rlgw.test_hooks import COMMIT_DELAY_ENV, FAULT_ENV, NAN_LOSS_ENV
from trainer.backends.parity import reference_scores, served_scores
from trainer.backends.vllm_control import VllmControl
from trainer.config import TrainerConfig
from trainer.errors import PushRefused
from trainer.loop.distributed import TIMEOUT_ENV
from trainer.loop.phases import PHASES
from trainer.loop.service import NO_SIGNAL, OnlineTrainer
from trainer.models.weights import apply_delta
from trainer.publishing.publish import Publisher
from trainer.publishing.push import push

from conftest import (
    MODEL_NAME,
    LiveServer,
    free_port,
    gateway_settings,
    start_vllm_servers,
    stop_vllm_servers,
)
from swap_helpers import random_delta, write_delta


class Env:
    def __init__(
        self,
        db_url: str,
        backend: str,
        backend_proc: subprocess.Popen,
        gateway: str,
        home: Path,
        model_dir: Path,
    ) -> None:
        self.db_url, self.backend, self.gateway, self.home = db_url, backend, gateway, home
        self.backend_proc, self.model_dir = backend_proc, model_dir
        self.settings = gateway_settings(db_url).model_copy(update={"home": home})
        self.http = httpx.Client(base_url=gateway, timeout=120)

    def episode(self, reward: float, **session) -> tuple[str, str]:
        """One rewarded, closed session with one completion; returns (session id, completion id)."""
        s = self.http.post("/v1/sessions", json=session).json()
        reply = openai.OpenAI(base_url=s["base_url"], api_key="unused").chat.completions.create(
            model=MODEL_NAME,
            messages=[{"role": "user", "content": "Say A"}],
            max_tokens=6,
            temperature=1.0,
        )
        assert (
            self.http.post(f"/v1/sessions/{s['id']}/rewards", json={"value": reward}).status_code
            == 201
        )
        self.http.post(f"/v1/sessions/{s['id']}/close")
        return s["id"], reply.id

    def db(self) -> Session:
        return Session(create_engine(self.db_url))

    def trainer(self, **config) -> OnlineTrainer:
        engine = make_sync_engine(self.db_url)
        return OnlineTrainer(
            self.settings,
            engine,
            MODEL_NAME,
            TrainerConfig(**{"lr": 1e-3, "batch_sessions": 16, **config}),
            log=print,
        )

    def ledger(self) -> list[tuple]:
        with self.db() as db:
            return [
                tuple(r)
                for r in db.execute(
                    select(
                        Consumption.version,
                        Consumption.session_id,
                        Consumption.completion_id,
                        Consumption.used,
                        Consumption.reason,
                    ).order_by(Consumption.id)
                )
            ]


@pytest.fixture(scope="module")
def env(make_database, tiny_model_dir, tmp_path_factory) -> Iterator[Env]:
    yield from trainer_env(make_database, tiny_model_dir, tmp_path_factory, "train")


def trainer_env(make_database, tiny_model_dir, tmp_path_factory, label: str) -> Iterator[Env]:
    """A migrated database, a vLLM server of its own (versions are pushed into it) registered
    for the tiny model, and a gateway on them; `label` names the temporary folders."""
    db_url = make_database()
    upgrade(db_url)
    servers = start_vllm_servers(tiny_model_dir, tmp_path_factory.mktemp(f"{label}-logs"))
    engine = make_sync_engine(db_url)
    register_backend(
        sync_session_factory(engine), MODEL_NAME, servers[0][1], model_path=str(tiny_model_dir)
    )
    engine.dispose()
    with LiveServer(create_app(gateway_settings(db_url)), free_port()) as gw:
        yield Env(
            db_url,
            servers[0][1],
            servers[0][0],
            gw.url,
            tmp_path_factory.mktemp(f"{label}-home"),
            tiny_model_dir,
        )
    stop_vllm_servers(servers)


def gateway_heard(env: Env, version: int, timeout_s: float = 30) -> None:
    """Wait until the gateway's own view of the backend (GET /healthz) serves `version`."""
    deadline = time.monotonic() + timeout_s
    while env.http.get("/healthz").json()["backends"][0]["served_version"] != version:
        assert time.monotonic() < deadline, f"the gateway never heard of version {version}"
        time.sleep(0.05)


def drain_queue(env: Env) -> None:
    """Consume whatever earlier tests left eligible, so each test starts from an empty queue."""
    trainer = env.trainer(max_staleness=100)
    while trainer.step() is not None:
        pass
    trainer.close()


def test_one_update_is_served_verified_and_recorded_in_the_ledger(env, capsys):
    drain_queue(env)
    episodes = [env.episode(r) for r in (1.0, 0.0, 0.5, 1.0)]
    trainer = env.trainer()
    start = trainer.version
    report = trainer.step()
    assert report is not None and report.version == start + 1
    assert [s.outcome for s in report.swaps] == ["swapped"]
    served = served_scores(httpx.Client(), env.backend, MODEL_NAME)
    assert served.max_abs_diff(reference_scores(trainer.model)) <= 1e-4
    # The gateway hears the swap's commit by NOTIFY; the trainer runs in this process too, so on
    # a loaded machine that can take a moment. New requests are those sent after it heard.
    gateway_heard(env, start + 1)
    new_reply = openai.OpenAI(
        base_url=f"{env.gateway}/v1", api_key="unused"
    ).chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=3
    )
    admin = httpx.Client(base_url=env.gateway, headers={"X-Admin-Key": env.settings.admin_key})
    assert admin.get(f"/admin/completions/{new_reply.id}").json()["policy_version"] == start + 1
    used = [(v, s, c) for v, s, c, ok, _ in env.ledger() if v == start + 1 and ok]
    assert sorted(used) == sorted((start + 1, s, c) for s, c in episodes)
    with env.db() as db:
        assert {db.get(AgentSession, s).status for s, _ in episodes} == {"consumed"}
        metrics = db.scalar(select(PolicyVersion.metrics).where(PolicyVersion.version == start + 1))
    assert {"loss", "kl_behave", "reward_mean", "pause_s", "config"} <= set(metrics)
    # Where the step's time went: every phase, the swap's of its one backend too, on its row.
    # in order (the row's jsonb keeps none); published in line: no `launch` phase
    assert tuple(report.metrics["phases"]) == tuple(p for p in PHASES if p != "launch")
    assert metrics["phases"] == pytest.approx(report.metrics["phases"])
    assert all(s >= 0 for s in metrics["phases"].values())
    assert sum(metrics["phases"].values()) <= metrics["step_s"]
    assert f"[phases] v{start + 1}  claim " in capsys.readouterr().out
    versions = admin.get("/admin/versions").json()
    assert versions[-1]["version"] == start + 1 and "loss" in versions[-1]["metrics"]
    assert trainer.step() is None  # the same sessions are not consumed again
    trainer.close()
    reply = env.http.post(f"/v1/sessions/{episodes[0][0]}/rewards", json={"value": 1.0})
    assert reply.status_code == 409 and reply.json()["error"]["code"] == "session_consumed"


def run_trainer_process(env: Env, fault: str | None) -> subprocess.CompletedProcess:
    environment = {**os.environ, "RLGW_DATABASE_URL": env.db_url, "RLGW_HOME": str(env.home)}
    environment.pop(FAULT_ENV, None)
    if fault:
        environment[FAULT_ENV] = fault
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "rlgw_cli",
            "train",
            "--model",
            MODEL_NAME,
            "--max-versions",
            "1",
            "--batch-sessions",
            "16",
        ],
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )


def current_version(env: Env) -> int:
    with env.db() as db:
        return db.execute(
            text("SELECT current_version FROM models WHERE name = :n"), {"n": MODEL_NAME}
        ).scalar_one()


def test_a_crash_before_commit_loses_nothing_and_trains_nothing_twice(env):
    drain_queue(env)
    episodes = [env.episode(r) for r in (1.0, 0.0, 1.0)]
    version = current_version(env)
    crashed = run_trainer_process(env, "crash-before-commit")
    assert crashed.returncode == 86, crashed.stdout + crashed.stderr
    assert current_version(env) == version  # no version from the crashed update
    with env.db() as db:
        assert {db.get(AgentSession, s).status for s, _ in episodes} == {"claimed"}
    again = run_trainer_process(env, None)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "released 3 session(s)" in again.stdout
    assert current_version(env) == version + 1
    rows = [(s, c) for v, s, c, ok, _ in env.ledger() if ok and s in {e[0] for e in episodes}]
    assert sorted(rows) == sorted(episodes)  # each completion exactly once


def test_a_crash_after_commit_brings_the_backend_up_to_date_on_restart(env):
    drain_queue(env)
    env.episode(1.0)
    env.episode(0.0)
    version = current_version(env)
    crashed = run_trainer_process(env, "crash-after-commit")
    assert crashed.returncode == 86, crashed.stdout + crashed.stderr
    assert current_version(env) == version + 1
    assert env.http.get("/healthz").json()["backends"][0]["served_version"] == version
    ledger_before = env.ledger()
    trainer = env.trainer()  # a restart: finds the backend behind and syncs it
    trainer.close()
    with httpx.Client(base_url=env.gateway) as http:
        assert http.get("/healthz").json()["backends"][0]["served_version"] == version + 1
    assert env.ledger() == ledger_before  # nothing retrained


def test_stale_completions_are_skipped_with_a_recorded_reason(env):
    drain_queue(env)
    stale_session, stale_completion = env.episode(1.0)
    trainer = env.trainer(max_staleness=0)
    env.episode(0.5)  # hold the stale session back: train on another one first
    with env.db() as db, db.begin():
        db.execute(
            text("UPDATE sessions SET status = 'open' WHERE id = :id"), {"id": stale_session}
        )
    trainer.step()
    with env.db() as db, db.begin():
        db.execute(
            text("UPDATE sessions SET status = 'closed' WHERE id = :id"), {"id": stale_session}
        )
    fresh = env.episode(0.5)  # a learning signal: a batch without one makes no version
    report = trainer.step()
    trainer.close()
    assert report is not None and report.skipped == 1
    rows = {
        c: (ok, reason) for _, s, c, ok, reason in env.ledger() if s in (stale_session, fresh[0])
    }
    assert rows[fresh[1]] == (True, None)
    assert rows[stale_completion][0] is False and "stale" in rows[stale_completion][1]


def test_a_restarted_trainer_keeps_its_adamw_moments(env):
    """The optimizer state reached by the last committed version is restored on restart, so the
    next update continues the same AdamW trajectory; a state of another version is not used."""
    drain_queue(env)
    env.episode(1.0)
    env.episode(0.0)
    first = env.trainer()
    assert first.step() is not None
    trained = first.optimizer.state_dict()
    first.close()
    second = env.trainer()
    restored = second.optimizer.state_dict()
    second.close()
    assert restored["state"].keys() == trained["state"].keys() and trained["state"]
    for key, moments in trained["state"].items():
        for name in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(restored["state"][key][name], moments[name]), (key, name)

    index = torch.load(second.optimizer_path, weights_only=True)  # the slots' index
    # as if the trainer stopped between a commit and its save
    index["slots"][index["latest"]]["version"] -= 1
    torch.save(index, second.optimizer_path)
    third = env.trainer()
    third.close()
    assert third.optimizer.state_dict()["state"] == {}


# ----------------------------------------------------------------------------- versions never wedge


def backend_row(env: Env) -> tuple[int, str, int]:
    """The model's one backend in the registry: (id, state, served version)."""
    with env.db() as db:
        (row,) = db.execute(text("SELECT id, state, served_version FROM backends")).all()
    return tuple(row)


def latest_reference(env: Env) -> torch.nn.Module:
    engine = make_sync_engine(env.db_url)
    with Publisher(env.settings, engine, MODEL_NAME) as publisher:
        _, model = publisher.latest()
    engine.dispose()
    return model


def served_matches(env: Env, model: torch.nn.Module) -> bool:
    served = served_scores(httpx.Client(timeout=120), env.backend, MODEL_NAME)
    return served.max_abs_diff(reference_scores(model)) <= 1e-4


def assert_a_training_step_swaps_the_next_version(env: Env) -> None:
    """Two rewarded sessions, one update on top of the latest version, served and ledgered."""
    episodes = [env.episode(r) for r in (1.0, 0.0)]
    version = current_version(env)
    trainer = env.trainer()
    assert trainer.version == version
    report = trainer.step()
    trainer.close()
    assert report is not None and report.version == version + 1
    assert [(s.outcome, s.kind) for s in report.swaps] == [("swapped", "delta")]
    assert served_matches(env, trainer.model)
    used = [(s, c) for v, s, c, ok, _ in env.ledger() if v == version + 1 and ok]
    assert sorted(used) == sorted(episodes)


def test_a_push_every_backend_refused_is_recorded_and_the_next_push_brings_it(env, tmp_path):
    """The backend hangs (SIGSTOP) and the stage times out: the version is recorded and current
    anyway, the backend keeps serving the old one, and the next push installs the newer version
    with full weights, which include the refused delta; then training continues on top."""
    drain_queue(env)
    version = current_version(env)
    refused_delta, next_delta = (random_delta(env.model_dir, seed) for seed in (21, 22))
    expected = latest_reference(env)  # plus both deltas: what is served in the end
    os.kill(env.backend_proc.pid, signal.SIGSTOP)
    try:
        with pytest.raises(PushRefused) as refused:
            push(
                env.settings,
                env.db_url,
                MODEL_NAME,
                delta=write_delta(refused_delta, tmp_path / "refused.safetensors"),
                timeout_s=3,
            )
    finally:
        os.kill(env.backend_proc.pid, signal.SIGCONT)
    assert [r.outcome for r in refused.value.reports] == ["refused"]
    assert "\n" not in str(refused.value) and f"version {version + 1} " in str(refused.value)
    assert current_version(env) == version + 1  # the version row is the truth
    assert backend_row(env)[1:] == ("active", version)  # refused at staging: untouched, serving
    # The stage it received while stopped runs now; one more worker call waits for it.
    VllmControl(httpx.Client(timeout=120), env.backend).rpc("rlgw_checksum")

    reports = push(
        env.settings,
        env.db_url,
        MODEL_NAME,
        delta=write_delta(next_delta, tmp_path / "next.safetensors"),
    )
    assert [(r.outcome, r.kind) for r in reports] == [("swapped", "full")]  # it was behind
    assert current_version(env) == version + 2
    assert backend_row(env)[1:] == ("active", version + 2)
    for delta in (refused_delta, next_delta):
        apply_delta(expected, delta)
    assert served_matches(env, expected)
    assert_a_training_step_swaps_the_next_version(env)


def test_a_push_with_no_backend_is_recorded_and_a_backend_registered_later_catches_up(
    env, tmp_path
):
    drain_queue(env)
    version = current_version(env)
    engine = make_sync_engine(env.db_url)
    with engine.begin() as conn:  # the operator removes the model's only backend
        backend_id = backend_row(env)[0]
        conn.execute(text("DELETE FROM backends WHERE id = :id"), {"id": backend_id})
        conn.execute(text("SELECT pg_notify('rlgw_backends', :id)"), {"id": str(backend_id)})
    delta = random_delta(env.model_dir, 23)
    with pytest.raises(PushRefused, match="has no backend registered") as refused:
        push(
            env.settings,
            env.db_url,
            MODEL_NAME,
            delta=write_delta(delta, tmp_path / "alone.safetensors"),
        )
    assert refused.value.reports == [] and current_version(env) == version + 1

    register_backend(sync_session_factory(engine), MODEL_NAME, env.backend)
    engine.dispose()
    assert backend_row(env)[1:] == ("active", version)  # what it serves: behind
    reports = push(
        env.settings,
        env.db_url,
        MODEL_NAME,
        delta=write_delta(random_delta(env.model_dir, 24), tmp_path / "next.safetensors"),
    )
    assert [(r.outcome, r.kind) for r in reports] == [("swapped", "full")]
    assert current_version(env) == version + 2
    assert backend_row(env)[1:] == ("active", version + 2)
    assert served_matches(env, latest_reference(env))
    assert_a_training_step_swaps_the_next_version(env)


def train_one_version_in_two_processes(
    env, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`rlgw train --nproc 2 --max-versions 1` on the test's database and home."""
    environment = {**os.environ, "RLGW_DATABASE_URL": env.db_url, "RLGW_HOME": str(env.home)}
    environment.pop(FAULT_ENV, None)
    return subprocess.run(
        [sys.executable, "-m", "rlgw_cli", "train", "--model", MODEL_NAME]
        + ["--max-versions", "1", "--batch-sessions", "16", "--nproc", "2"],
        env={**environment, **(extra_env or {})},
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_two_trainer_processes_push_a_version_that_passes_the_swap(env):
    """`rlgw train --nproc 2`: FSDP2 over gloo; rank 0 alone claims, commits and pushes, and the
    backend serves the gathered weights (parity against the version's own reference)."""
    drain_queue(env)
    episodes = [env.episode(r) for r in (1.0, 0.0, 0.5, 1.0)]
    version = current_version(env)
    done = train_one_version_in_two_processes(env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "2 process(es)" in done.stdout and "[swapped]" in done.stdout, done.stdout[-2000:]
    assert current_version(env) == version + 1
    used = sorted((s, c) for v, s, c, ok, _ in env.ledger() if v == version + 1 and ok)
    assert used == sorted(episodes)  # each completion once, by rank 0 alone
    with Publisher(env.settings, make_sync_engine(env.db_url), MODEL_NAME) as publisher:
        reference = publisher.latest()[1]  # the recorded version, rebuilt from its files
    served = served_scores(httpx.Client(), env.backend, MODEL_NAME)
    assert served.max_abs_diff(reference_scores(reference)) <= 1e-4


def test_the_other_rank_waits_while_rank_0_records_longer_than_a_collective_may_wait(env):
    """Rank 0 records and pushes alone (a 0.5B model's 1.4 GB commit takes tens of seconds on a
    CPU, a bigger one minutes): the other rank waits for its next word in the patient group, not
    in a collective bounded by the group's timeout (which would kill it mid-run)."""
    drain_queue(env)
    for reward in (1.0, 0.0, 0.5, 1.0):
        env.episode(reward)
    version = current_version(env)
    # rank 0 alone for 20 s before its commit, longer than a collective's 15 s
    done = train_one_version_in_two_processes(env, {TIMEOUT_ENV: "15", COMMIT_DELAY_ENV: "20"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "[swapped]" in done.stdout, done.stdout[-2000:]
    assert current_version(env) == version + 1


def test_a_recorded_version_exports_as_a_checkpoint_that_serves_the_same(env, tmp_path):
    """`rlgw export-model`: the latest version, rebuilt from its base and files, is a checkpoint
    transformers loads with the served log-probs of that version, and vLLM serves it the same."""
    from rlgw.backend_launcher import start_backend, stop_backend, wait_healthy
    from rlgw.model_dir import inspect_model_dir
    from rlgw_cli import main as rlgw_main
    from trainer.models.weights import load_reference_model

    drain_queue(env)
    env.episode(1.0)
    env.episode(0.0)
    trainer = env.trainer()
    assert trainer.step() is not None
    trainer.close()
    version = current_version(env)
    out = tmp_path / "exported"
    environment = {"RLGW_DATABASE_URL": env.db_url, "RLGW_HOME": str(env.home)}
    with pytest.MonkeyPatch.context() as patch:
        for key, value in environment.items():
            patch.setenv(key, value)
        with pytest.raises(SystemExit) as done:
            rlgw_main(["export-model", "--model", MODEL_NAME, "--out", str(out)])
    assert done.value.code == 0
    assert inspect_model_dir(out).architecture == "Qwen2ForCausalLM"
    assert json.loads((out / "rlgw_export.json").read_text())["version"] == version
    served = served_scores(httpx.Client(), env.backend, MODEL_NAME)  # the backend serves it
    assert served.max_abs_diff(reference_scores(load_reference_model(out))) <= 1e-4
    port = free_port()
    proc = start_backend(out, port, served_model_name="exported", log_path=tmp_path / "vllm.log")
    try:
        wait_healthy(f"http://127.0.0.1:{port}", timeout_s=420, proc=proc)
        again = served_scores(httpx.Client(timeout=300), f"http://127.0.0.1:{port}", "exported")
    finally:
        stop_backend(proc)
    assert again.max_abs_diff(served) <= 1e-4
    with pytest.MonkeyPatch.context() as patch:
        for key, value in environment.items():
            patch.setenv(key, value)
        with pytest.raises(SystemExit) as refused:
            rlgw_main(["export-model", "--model", MODEL_NAME, "--version", "999", "--out", "x"])
    assert refused.value.code == 2  # a usage error, said in one line


# Last in the module: the version it trains would shift the anchor versions of the tests above.
def test_a_group_with_one_reward_for_all_makes_no_version_and_says_why(env):
    """Every member of the group got 1.0: normalized, every advantage is 0 and the gradient is
    zero. No version is made (no step, no swap); the sessions are dropped with the reason."""
    drain_queue(env)
    same = [env.episode(1.0, group_id="all-right", group_size=3) for _ in range(3)]
    version = current_version(env)
    trainer = env.trainer()
    report = trainer.step()
    assert report is not None and report.version is None and report.sessions == 3
    assert current_version(env) == version
    with env.db() as db:
        rows = [db.get(AgentSession, s) for s, _ in same]
        assert {(r.status, r.dropped_reason) for r in rows} == {("dropped", NO_SIGNAL)}
    env.episode(1.0, group_id="mixed", group_size=2)
    env.episode(0.0, group_id="mixed", group_size=2)
    assert trainer.step().version == version + 1  # an ordinary group still trains
    trainer.close()


# ----------------------------------------------------------------------------- nothing non-finite


def add_raw_rewards(env: Env, session_id: str, values: list[float]) -> None:
    """Rewards written to the table directly, not over the API: the gateway's reward range check
    refuses values this large; the trainer must survive them anyway (rows written before that
    check existed, or by another writer)."""
    with env.db() as db, db.begin():
        for value in values:
            db.execute(
                text("INSERT INTO rewards (session_id, value, scope) VALUES (:s, :v, 'session')"),
                {"s": session_id, "v": value},
            )


def trainer_state(trainer: OnlineTrainer) -> tuple[dict, dict]:
    weights = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    state = trainer.optimizer.state_dict()
    moments = {
        key: {name: value.clone() for name, value in moments.items()}
        for key, moments in state["state"].items()
    }
    return weights, moments


def assert_same_state(trainer: OnlineTrainer, before: tuple[dict, dict]) -> None:
    weights, moments = trainer_state(trainer)
    assert weights.keys() == before[0].keys()
    assert all(torch.equal(weights[k], before[0][k]) for k in weights)
    assert moments.keys() == before[1].keys()
    for key, values in moments.items():
        assert all(torch.equal(v, before[1][key][n]) for n, v in values.items()), key


def dropped_reasons(env: Env, session_ids: list[str]) -> set[tuple[str, str]]:
    with env.db() as db:
        rows = [db.get(AgentSession, s) for s in session_ids]
        return {(r.status, r.dropped_reason.split(":")[0]) for r in rows}


def test_overflowing_rewards_and_a_nan_loss_make_no_version_and_the_next_group_trains(
    env, monkeypatch
):
    """A return that overflows (two rewards of 1e308: inf) makes its group's advantages NaN: the
    group is dropped before the update. A NaN injected into the loss skips the update. Neither
    makes a version, and the weights and AdamW moments stay exactly as they were. Then an
    ordinary group, beside a group of huge but finite rewards {1e308, 1e308, 0} (which the
    normalization now scales safely), trains a version that the real vLLM serves."""
    drain_queue(env)
    assert_a_training_step_swaps_the_next_version(env)  # AdamW holds real moments from here
    version = current_version(env)
    trainer = env.trainer()
    before = trainer_state(trainer)
    assert before[1], "the restarted trainer restored the moments of the last version"

    overflow = [env.episode(0.0, group_id="overflow", group_size=2)[0] for _ in range(2)]
    add_raw_rewards(env, overflow[0], [1e308, 1e308])
    report = trainer.step()
    assert report is not None and report.version is None and current_version(env) == version
    assert dropped_reasons(env, overflow) == {("dropped", "non-finite advantage")}
    assert_same_state(trainer, before)

    monkeypatch.setenv(NAN_LOSS_ENV, "1")
    poisoned = [env.episode(r, group_id="poisoned", group_size=2)[0] for r in (1.0, 0.0)]
    report = trainer.step()
    assert report is not None and report.version is None and current_version(env) == version
    assert dropped_reasons(env, poisoned) == {("dropped", "non-finite update")}
    assert_same_state(trainer, before)
    monkeypatch.delenv(NAN_LOSS_ENV)

    ordinary = [env.episode(r, group_id="ordinary", group_size=2)[0] for r in (1.0, 0.0)]
    huge = [env.episode(0.0, group_id="huge", group_size=3)[0] for _ in range(3)]
    add_raw_rewards(env, huge[0], [1e308])
    add_raw_rewards(env, huge[1], [1e308])
    report = trainer.step()
    trainer.close()
    assert report is not None and report.version == version + 1
    assert [s.outcome for s in report.swaps] == ["swapped"]
    assert served_matches(env, trainer.model)
    with env.db() as db:
        trained = db.execute(
            select(Consumption.session_id, Consumption.advantage).where(
                Consumption.version == version + 1, Consumption.used
            )
        ).all()
        metrics = db.scalar(
            select(PolicyVersion.metrics).where(PolicyVersion.version == version + 1)
        )
    assert {s for s, _ in trained} == set(ordinary + huge)
    by_session = {s: a for s, a in trained}
    assert by_session[huge[0]] == by_session[huge[1]] > 0 > by_session[huge[2]]
    assert metrics["entropy"] > 0 and metrics["skipped_frac"] == {}
    assert "kl_mismatch" in metrics or "kl_staleness" in metrics  # as the gateway had heard


def test_a_zero_variance_group_is_filtered_out_and_the_rest_of_the_batch_trains(env):
    """filter_zero_variance: the group whose members all got 1.0 is dropped before the update,
    with the reason; the other group trains, and only its sessions are consumed and ledgered."""
    drain_queue(env)
    version = current_version(env)
    same = [env.episode(1.0, group_id="same", group_size=2)[0] for _ in range(2)]
    mixed = [env.episode(r, group_id="mixed-2", group_size=2)[0] for r in (1.0, 0.0)]
    trainer = env.trainer(filter_zero_variance=True)
    report = trainer.step()
    trainer.close()
    assert report is not None and report.version == version + 1
    assert dropped_reasons(env, same) == {("dropped", "zero-variance group")}
    with env.db() as db:
        assert {db.get(AgentSession, s).status for s in mixed} == {"consumed"}
        ledgered = set(
            db.scalars(select(Consumption.session_id).where(Consumption.version == version + 1))
        )
        metrics = db.scalar(
            select(PolicyVersion.metrics).where(PolicyVersion.version == version + 1)
        )
    assert ledgered == set(mixed)
    assert metrics["skipped_frac"] == {"zero_variance": 0.5}
    # one turn a session: every sequence begins a session, none with a cut (each reason listed)
    assert metrics["cuts"] == {"branch": 0, "output_retokenized": 0, "history_edited": 0}
    assert metrics["config"]["filter_zero_variance"] is True


def test_the_per_task_baseline_survives_a_trainer_restart(env):
    """singleton_baseline=task_mean: the first sessions of a task train on their raw returns
    (no history); a new trainer (a restart) subtracts the mean return of the task's consumed
    sessions, read from Postgres."""
    drain_queue(env)
    first = [env.episode(r, task_id="sum-task")[0] for r in (1.0, 0.0, 1.0, 1.0)]
    trainer = env.trainer(singleton_baseline="task_mean")
    version = trainer.step().version
    trainer.close()
    later = [env.episode(r, task_id="sum-task")[0] for r in (1.0, 0.0)]
    restarted = env.trainer(singleton_baseline="task_mean")
    assert restarted.step().version == version + 1
    restarted.close()
    with env.db() as db:
        advantage = dict(
            db.execute(
                select(Consumption.session_id, Consumption.advantage).where(Consumption.used)
            ).all()
        )
    assert [advantage[s] for s in first] == [1.0, 0.0, 1.0, 1.0]
    assert [advantage[s] for s in later] == pytest.approx([1.0 - 0.75, 0.0 - 0.75])
