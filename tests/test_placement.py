"""Placements end to end at small scale (real vLLM, real Postgres): a colocated trainer pauses
generation at the gateway while it updates, and no request fails or carries the wrong version; a
separated backend and trainer run on disjoint cores, read back from the processes themselves."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session

from gateway.main import create_app
from migrations.runner import upgrade
from rlgw.backend_launcher import start_backend, stop_backend, wait_healthy
from rlgw.db.engine import make_sync_engine, sync_session_factory
from rlgw.db.models import Backend, Consumption
from rlgw.placement import Placement
from rlgw.registry import register_backend
from trainer.config import TrainerConfig
from trainer.loop.optimizer_state import load_state, state_path
from trainer.loop.service import OnlineTrainer
from trainer.swap.hold import HOLD_REASON, GenerationHold

from conftest import ADMIN_KEY, MODEL_NAME, LiveServer, free_port, gateway_settings
from swap_helpers import output_logprobs

CPUS = sorted(os.sched_getaffinity(0))


class Stack:
    def __init__(self, db_url: str, gateway: str, home: Path, backend: str) -> None:
        self.db_url, self.gateway, self.home, self.backend = db_url, gateway, home, backend
        self.settings = gateway_settings(db_url).model_copy(update={"home": home})
        self.http = httpx.Client(base_url=gateway, timeout=120)
        self.admin = httpx.Client(base_url=gateway, timeout=60, headers={"X-Admin-Key": ADMIN_KEY})

    def episode(self, reward: float) -> str:
        s = self.http.post("/v1/sessions", json={}).json()
        openai.OpenAI(base_url=s["base_url"], api_key="unused").chat.completions.create(
            model=MODEL_NAME, messages=[{"role": "user", "content": "Say A"}], max_tokens=6
        )
        self.http.post(f"/v1/sessions/{s['id']}/rewards", json={"value": reward})
        self.http.post(f"/v1/sessions/{s['id']}/close")
        return s["id"]


def make_stack(make_database, model_dir: Path, home: Path, placement: Placement):
    db_url = make_database()
    upgrade(db_url)
    port = free_port()
    proc = start_backend(
        model_dir,
        port,
        served_model_name=MODEL_NAME,
        log_path=home / f"vllm-{port}.log",
        placement=placement,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, timeout_s=420, proc=proc)
        httpx.post(
            f"{url}/v1/completions",
            timeout=300,
            json={"model": MODEL_NAME, "prompt": "warm up", "max_tokens": 4},
        )
        engine = make_sync_engine(db_url)
        register_backend(sync_session_factory(engine), MODEL_NAME, url, model_path=str(model_dir))
        engine.dispose()
    except BaseException:
        stop_backend(proc)
        raise
    return db_url, proc, url


@pytest.fixture(scope="module")
def colocated(make_database, tiny_model_dir, tmp_path_factory) -> Iterator[Stack]:
    home = tmp_path_factory.mktemp("colocated")
    db_url, proc, url = make_stack(make_database, tiny_model_dir, home, Placement("colocated"))
    try:
        with LiveServer(create_app(gateway_settings(db_url)), free_port()) as gw:
            yield Stack(db_url, gw.url, home, url)
    finally:
        stop_backend(proc)


def colocated_trainer(stack: Stack, **config) -> tuple[OnlineTrainer, list[str]]:
    lines: list[str] = []
    trainer = OnlineTrainer(
        stack.settings,
        make_sync_engine(stack.db_url),
        MODEL_NAME,
        TrainerConfig(**config),
        placement=Placement("colocated"),
        log=lines.append,
    )
    return trainer, lines


def test_a_colocated_update_holds_generation_and_no_request_fails(colocated: Stack):
    for reward in (1.0, 0.0, 1.0, 0.0):
        colocated.episode(reward)
    # the four episodes: a full batch
    trainer, lines = colocated_trainer(colocated, lr=1e-2, batch_sessions=4)
    before = copy.deepcopy(trainer.model)
    states: list[tuple[str, str | None]] = []
    replies: list[str] = []
    errors: list[BaseException] = []
    done = threading.Event()
    client = openai.OpenAI(base_url=f"{colocated.gateway}/v1", api_key="unused", max_retries=0)

    def traffic() -> None:
        while not done.is_set():
            try:
                reply = client.chat.completions.create(
                    model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=4
                )
                replies.append(reply.id)
            except BaseException as exc:  # a failed request is what this test must not see
                errors.append(exc)

    def watch() -> None:
        with Session(create_engine(colocated.db_url)) as db:
            while not done.is_set():
                row = db.execute(select(Backend.state, Backend.state_reason)).first()
                states.append(tuple(row))
                db.rollback()
                time.sleep(0.01)

    workers = [threading.Thread(target=traffic) for _ in range(2)] + [
        threading.Thread(target=watch)
    ]
    for w in workers:
        w.start()
    time.sleep(0.5)
    report = trainer.step()
    time.sleep(0.5)
    done.set()
    for w in workers:
        w.join(timeout=120)
    trainer.close()

    assert report is not None and report.version is not None
    assert [s.outcome for s in report.swaps] == ["swapped"]
    assert report.metrics["hold_s"] > 0
    # the AdamW moments of the version, written after the hold (generation ran again)
    saved, message = load_state(state_path(colocated.settings.home, MODEL_NAME), report.version)
    assert saved is not None, message
    assert "moments" in report.metrics["phases"]
    assert not [line for line in lines if line.startswith("[hold]")], lines  # pause, resume: 200
    events = colocated.home / "runs" / MODEL_NAME  # the version's TensorBoard scalars
    assert any(p.name.startswith("events.out.tfevents") for p in events.iterdir())
    assert ("draining", HOLD_REASON) in states  # generation was out of routing for the update
    assert states[-1] == ("active", None)  # and came back
    assert not errors, errors[:3]
    assert replies
    references = {report.version - 1: before, report.version: trainer.model}
    # every stamped version is the one that produced the tokens: an answer the hold froze goes
    # on from the new version, each of its tokens stamped with its own
    for completion_id in replies:
        record = colocated.admin.get(f"/admin/completions/{completion_id}").json()
        assert record["status"] == "complete", record
        if not record["eligible"]:
            assert "swap" in record["eligibility_reason"], record  # crossed one: excluded
            continue
        output = record["output_token_ids"]
        versions = record["output_versions"] or [record["policy_version"]] * len(output)
        for version in set(versions):
            expected = output_logprobs(references[version], record["prompt_token_ids"], output)
            diffs = [
                abs(a - b)
                for a, b, v in zip(expected, record["output_logprobs"], versions, strict=True)
                if v == version
            ]
            assert max(diffs) < 1e-4, (version, versions, max(diffs))


class LongAnswer:
    """CHOICES streamed choices of 1,000 tokens through the gateway (seconds of work for the
    tiny model), read in a thread: the completion id of its first choice, each choice's finish."""

    TOKENS, CHOICES = 1000, 16

    def __init__(self, gateway: str) -> None:
        self.client = openai.OpenAI(base_url=f"{gateway}/v1", api_key="unused", max_retries=0)
        self.chunks = 0
        self.id: str | None = None
        self.finish: dict[int, str] = {}
        self.reader = threading.Thread(target=self._read)
        self.reader.start()
        while self.chunks < 5:  # it has begun
            time.sleep(0.01)

    def _read(self) -> None:
        stream = self.client.chat.completions.create(
            model=MODEL_NAME,
            messages=[{"role": "user", "content": "A long answer, please."}],
            max_tokens=self.TOKENS,
            n=self.CHOICES,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        for chunk in stream:
            self.chunks += 1
            self.id = self.id or chunk.id
            self.finish.update({c.index: c.finish_reason for c in chunk.choices if c.finish_reason})

    def join(self) -> None:
        self.reader.join(timeout=300)
        assert not self.reader.is_alive()
        assert self.finish == dict.fromkeys(range(self.CHOICES), "length"), self.finish


def generated_tokens(backend: str) -> float:
    """vLLM's own count of the tokens it has generated."""
    metrics = httpx.get(f"{backend}/metrics", timeout=30).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("vllm:generation_tokens_total")
    )


@pytest.mark.parametrize("sleep_level", [None, 1], ids=["cpu", "with-sleep"])
def test_a_colocated_hold_freezes_the_answer_in_flight_and_it_goes_on_after_the_hold(
    colocated: Stack, sleep_level: int | None
):
    """The hold does not wait for the answers in flight: it pauses vLLM in place, no token comes
    while the trainer has the cores, and the answer ends whole afterwards, on the same version.
    With vLLM's sleep (what a GPU trainer asks for; on the CPU build it only pauses the
    scheduler, and its wake-up resumes it) the answer stays frozen after the wake-up too."""
    trainer, lines = colocated_trainer(colocated)
    coordinator, model_id = trainer.publisher.coordinator, trainer.publisher.model.id
    answer = LongAnswer(colocated.gateway)
    hold = GenerationHold(coordinator, model_id, sleep_level=sleep_level, log=lines.append)
    try:
        with hold:
            assert len(answer.finish) < LongAnswer.CHOICES  # entered without waiting for it
            time.sleep(0.3)
            frozen = generated_tokens(colocated.backend)
            time.sleep(1.0)
            assert generated_tokens(colocated.backend) == frozen  # vLLM generates nothing
            hold.wake()  # what the trainer does before its swap (one step may slip through)
            time.sleep(0.3)
            frozen = generated_tokens(colocated.backend)
            time.sleep(0.5)
            assert generated_tokens(colocated.backend) == frozen  # paused in place again
            with Session(create_engine(colocated.db_url)) as db:
                state = db.execute(select(Backend.state, Backend.state_reason)).one()
            assert tuple(state) == ("draining", HOLD_REASON)
        answer.join()
    finally:
        trainer.close()
    assert generated_tokens(colocated.backend) > frozen  # it went on after the hold
    assert hold.report.backends and not hold.report.problems, hold.report
    assert not [line for line in lines if line.startswith("[hold]")], lines
    record = colocated.admin.get(f"/admin/completions/{answer.id}").json()
    assert record["status"] == "complete" and record["eligible"], record
    assert len(record["output_token_ids"]) == LongAnswer.TOKENS
    assert set(record["output_versions"] or [record["policy_version"]]) == {
        record["policy_version"]
    }


def test_an_answer_frozen_by_a_colocated_update_goes_on_from_the_new_version(colocated: Stack):
    """An update while an answer is in flight: the answer is cut where the hold froze it, its
    tokens after the cut come from the new version, and it is complete and trainable."""
    for reward in (1.0, 0.0, 1.0, 0.0):
        colocated.episode(reward)
    trainer, lines = colocated_trainer(colocated, lr=1e-2, batch_sessions=4)
    answer = LongAnswer(colocated.gateway)
    try:
        report = trainer.step()
        answer.join()
    finally:
        trainer.close()
    assert report is not None and report.version is not None
    assert [s.outcome for s in report.swaps] == ["swapped"], lines
    assert (report.swaps[0].held or 0) >= 1  # the swap's pause found the frozen answer
    record = colocated.admin.get(f"/admin/completions/{answer.id}").json()
    assert record["status"] == "complete" and record["eligible"], record
    versions = record["output_versions"]
    assert versions is not None and len(versions) == LongAnswer.TOKENS
    assert versions == sorted(versions)
    assert set(versions) == {report.version - 1, report.version}, sorted(set(versions))


@pytest.mark.skipif(len(CPUS) < 2, reason="a separated placement needs 2 CPUs")
def test_separated_backend_and_trainer_run_on_disjoint_cores(
    make_database, tiny_model_dir, tmp_path
):
    placement = Placement.choose("separated")
    db_url, proc, url = make_stack(make_database, tiny_model_dir, tmp_path, placement)
    try:
        group = [
            int(pid) for pid in os.listdir("/proc") if pid.isdigit() and _pgid(int(pid)) == proc.pid
        ]
        assert group, "no vLLM process found"
        for pid in group:  # the server and every engine process it spawned
            assert os.sched_getaffinity(pid) == placement.backend_cpus, pid
        with LiveServer(create_app(gateway_settings(db_url)), free_port()) as gw:
            stack = Stack(db_url, gw.url, tmp_path, url)
            sessions = [stack.episode(r) for r in (1.0, 0.0)]
            env = {**os.environ, "RLGW_DATABASE_URL": db_url, "RLGW_HOME": str(tmp_path)}
            trainer = subprocess.Popen(
                [sys.executable, "-m", "rlgw_cli", "train", "--model", MODEL_NAME]
                + ["--max-versions", "1", "--placement", "separated"],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            lines: list[str] = []
            reader = threading.Thread(target=lambda: lines.extend(trainer.stderr), daemon=True)
            reader.start()
            seen: set[int] = set()
            while trainer.poll() is None:  # from its placement line on, until it exits
                if any("[train] placement" in line for line in lines):
                    try:
                        seen |= os.sched_getaffinity(trainer.pid)
                    except ProcessLookupError:
                        break
                time.sleep(0.05)
            out = trainer.stdout.read()
            trainer.wait(timeout=300)
            reader.join(timeout=10)
            err = "".join(lines)
            assert trainer.returncode == 0, out + err
    finally:
        stop_backend(proc)
    assert seen == placement.trainer_cpus and not seen & placement.backend_cpus
    assert f"{len(placement.trainer_cpus)} torch threads" in err
    with Session(create_engine(db_url)) as db:
        consumed = {c.session_id for c in db.scalars(select(Consumption)) if c.used}
    assert consumed == set(sessions)


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None
