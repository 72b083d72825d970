"""Verified weight swaps into two live vLLM CPU backends behind one gateway (and a replica)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import torch
from sqlalchemy import create_engine, select, text
from sqlalchemy.orm import Session

from gateway.main import create_app
from migrations.runner import upgrade
from rlgw.db.engine import make_sync_engine, sync_session_factory
from rlgw.db.models import Completion, RegisteredModel
from rlgw.db.token_arrays import unpack_ids, unpack_logprobs
from rlgw.registry import register_backend
from rlgw.settings import Settings
from rlgw.test_hooks import STAGE_GATE_ENV
from trainer.backends.parity import ProbeScores, reference_scores, served_scores
from trainer.backends.vllm_control import VllmControl
from trainer.models.weights import write_update
from trainer.publishing.push import PushError, push
from trainer.swap.coordinator import SwapCoordinator, SwapPlan, failed_label
from trainer.weight_update.files import DeltaFile

from conftest import (
    ADMIN_KEY,
    MODEL_NAME,
    LiveServer,
    free_port,
    gateway_settings,
    start_vllm_servers,
    stop_vllm_servers,
)
from serve_process import serve_process
from swap_helpers import output_logprobs, random_delta, reference_with, write_delta

TOL = 1e-4
HELD_CHOICES = 16  # n of a stream a swap holds: seconds of work for the tiny model


class Stack:
    """Two backends, one database, a gateway and a second gateway replica."""

    def __init__(
        self,
        db_url: str,
        backends: list[str],
        gateway: str,
        replica: str,
        home: Path,
        model_dir: Path,
        stage_gate: Path,
    ) -> None:
        self.db_url, self.backends, self.gateway, self.replica = db_url, backends, gateway, replica
        self.home, self.model_dir = home, model_dir
        self.stage_gate = stage_gate  # while it is absent, a backend's stage waits (test hook)
        self.settings = gateway_settings(db_url).model_copy(update={"home": home})
        self.http = httpx.Client(timeout=120)
        self.applied: list[dict[str, torch.Tensor]] = []  # deltas served, in order

    def admin(self, base: str | None = None) -> httpx.Client:
        return httpx.Client(
            base_url=base or self.gateway, timeout=60, headers={"X-Admin-Key": ADMIN_KEY}
        )

    def push_delta(self, seed: int, tmp: Path) -> list:
        delta = random_delta(self.model_dir, seed)
        reports = push(
            self.settings,
            self.db_url,
            MODEL_NAME,
            delta=write_delta(delta, tmp / f"delta-{seed}.safetensors"),
        )
        if all(r.outcome == "swapped" for r in reports):
            self.applied.append(delta)
        return reports

    def next_version(
        self, delta_path: Path, *, reference_new: ProbeScores, reference_old: ProbeScores
    ) -> tuple[SwapCoordinator, SwapPlan]:
        """A coordinator on the stack's database (dispose its engine after use) and a plan that
        installs the delta at `delta_path` as the next version, checked against the references
        given (the tests make them wrong on purpose)."""
        engine = create_engine(self.db_url)
        with Session(engine) as db:
            model_id = db.scalar(
                select(RegisteredModel.id).where(RegisteredModel.name == MODEL_NAME)
            )
        plan = SwapPlan(
            model_name=MODEL_NAME,
            model_id=model_id,
            parent_version=self.version(),
            new_version=self.version() + 1,
            update=DeltaFile(delta_path),
            reference_new=reference_new,
            reference_old=reference_old,
        )
        return SwapCoordinator(engine, drain_timeout_s=5, parity_tolerance=TOL), plan

    def reference(self, upto: int | None = None) -> torch.nn.Module:
        return reference_with(self.model_dir, *self.applied[:upto])

    def version(self) -> int:
        return len(self.applied)


@pytest.fixture(scope="module")
def stack(make_database, tiny_model_dir, tmp_path_factory) -> Iterator[Stack]:
    db_url = make_database()
    upgrade(db_url)
    stage_gate = tmp_path_factory.mktemp("gate") / "stage-gate"
    stage_gate.touch()  # stages run through; a test removes it to hold a stage open
    with pytest.MonkeyPatch.context() as env:
        env.setenv(STAGE_GATE_ENV, str(stage_gate))
        servers = start_vllm_servers(tiny_model_dir, tmp_path_factory.mktemp("swap-logs"), count=2)
    engine = make_sync_engine(db_url)
    for _, url in servers:
        register_backend(
            sync_session_factory(engine), MODEL_NAME, url, model_path=str(tiny_model_dir)
        )
    engine.dispose()
    settings = gateway_settings(db_url).model_copy(update={"backend_refresh_s": 60.0})
    logs = tmp_path_factory.mktemp("gateway-logs")
    # The gateway in a process of its own (as deployed): in this process, its event loop would
    # share the GIL with the tests' traffic threads and torch, and hear NOTIFYs late.
    gateway_env = {
        "RLGW_ADMIN_KEY": ADMIN_KEY,
        "RLGW_AUTH": "off",
        "RLGW_BACKEND_REFRESH_S": "60",
        "RLGW_HOME": str(tmp_path_factory.mktemp("gateway-home")),
    }
    with (
        serve_process(db_url, log_path=logs / "gateway.log", **gateway_env) as gw,
        LiveServer(create_app(settings), free_port()) as replica,
    ):
        yield Stack(
            db_url,
            [url for _, url in servers],
            gw,
            replica.url,
            tmp_path_factory.mktemp("home"),
            tiny_model_dir,
            stage_gate,
        )
    stop_vllm_servers(servers)


def chat(base: str, **kwargs):
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    return client.chat.completions.create(
        model=MODEL_NAME,
        messages=[{"role": "user", "content": "Hello there"}],
        **{"max_tokens": 8, **kwargs},
    )


def records(db_url: str) -> list[Completion]:
    engine = create_engine(db_url)
    with Session(engine) as db:
        rows = list(db.scalars(select(Completion).order_by(Completion.created_at)))
    engine.dispose()
    return rows


def _held_stream(stack: Stack):
    """HELD_CHOICES streamed choices of 1,900 tokens at temperature 1, started and left unread
    (its events outgrow the sockets' buffers): the stream and its first chunk."""
    client = openai.OpenAI(base_url=f"{stack.gateway}/v1", api_key="unused", max_retries=0)
    stream = client.chat.completions.create(
        model=MODEL_NAME,
        messages=[{"role": "user", "content": "Go on."}],
        max_tokens=1900,
        n=HELD_CHOICES,
        temperature=1.0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    return stream, next(iter(stream))


def test_pushed_delta_is_served_exactly_and_new_completions_carry_it(stack, tmp_path):
    reports = stack.push_delta(seed=1, tmp=tmp_path)
    assert [r.outcome for r in reports] == ["swapped", "swapped"], [r.reason for r in reports]
    assert all(r.parity_diff <= TOL for r in reports)
    reference = reference_scores(stack.reference())
    for url in stack.backends:
        served = served_scores(stack.http, url, MODEL_NAME)
        assert served.next_token == reference.next_token  # the greedy token
        assert abs(served.next_logprob - reference.next_logprob) <= TOL
        assert served.max_abs_diff(reference) <= TOL
    reply = chat(stack.gateway)
    with stack.admin() as admin:
        assert admin.get(f"/admin/completions/{reply.id}").json()["policy_version"] == 1
        backends = admin.get("/admin/backends").json()
        assert {b["served_version"] for b in backends} == {1}
        assert {b["state"] for b in backends} == {"active"}
        versions = admin.get("/admin/versions").json()
        assert [(v["version"], v["kind"]) for v in versions] == [(0, "base"), (1, "delta")]


@pytest.mark.parametrize("corruption", ["wrong-shape", "unknown-name", "nan"])
def test_corrupt_delta_is_refused_and_nothing_is_half_applied(stack, tmp_path, corruption):
    version = stack.version()
    good = random_delta(stack.model_dir, seed=99)
    bad = dict(good)
    if corruption == "wrong-shape":
        bad["model.layers.1.mlp.down_proj.weight"] = torch.zeros(3, 3)
    elif corruption == "unknown-name":
        bad["model.layers.7.self_attn.q_proj.weight"] = torch.zeros(64, 64)
    else:
        bad["model.layers.1.mlp.down_proj.weight"] = torch.full_like(
            good["model.layers.1.mlp.down_proj.weight"], float("nan")
        )
    path = tmp_path / "bad.safetensors"
    write_update(bad, path)
    with pytest.raises(PushError):  # the CLI path refuses it before recording a version
        push(stack.settings, stack.db_url, MODEL_NAME, delta=path)

    expected = reference_scores(stack.reference())
    coordinator, plan = stack.next_version(path, reference_new=expected, reference_old=expected)
    checksums = [VllmControl(stack.http, url).rpc("rlgw_checksum") for url in stack.backends]
    reports = coordinator.push(plan)
    coordinator.engine.dispose()
    assert [r.outcome for r in reports] == ["refused", "refused"]  # the backends refused it
    # Bitwise untouched, not only within the parity tolerance.
    assert [
        VllmControl(stack.http, url).rpc("rlgw_checksum") for url in stack.backends
    ] == checksums
    for url in stack.backends:
        assert served_scores(stack.http, url, MODEL_NAME).max_abs_diff(expected) <= TOL
        assert stack.http.get(f"{url}/weight_info").json()["weight_version"] == str(version)
    with stack.admin() as admin:
        assert {(b["state"], b["served_version"]) for b in admin.get("/admin/backends").json()} == {
            ("active", version)
        }


def test_failed_parity_rolls_back_and_says_why(stack, tmp_path):
    version = stack.version()
    old = reference_scores(stack.reference())
    wrong = reference_scores(reference_with(stack.model_dir, random_delta(stack.model_dir, 7)))
    path = write_delta(random_delta(stack.model_dir, seed=8), tmp_path / "d.safetensors")
    # Parity cannot pass.
    coordinator, plan = stack.next_version(path, reference_new=wrong, reference_old=old)
    backend = coordinator.backends(plan.model_id)[0]
    report = coordinator.swap_backend(backend, plan)
    coordinator.engine.dispose()
    assert report.outcome == "rolled_back" and "parity failed" in report.reason
    assert served_scores(stack.http, backend.url, MODEL_NAME).max_abs_diff(old) <= TOL
    with stack.admin() as admin:
        listed = {b["id"]: b for b in admin.get("/admin/backends").json()}[backend.id]
    assert listed["state"] == "active" and listed["served_version"] == version
    assert "parity failed" in listed["state_reason"]
    assert f"kept version {version} (verified)" in listed["state_reason"]


def test_a_swap_that_cannot_verify_the_old_weights_leaves_the_backend_failed(stack, tmp_path):
    """Parity fails, the rollback cannot be verified (here: a wrong old reference): the backend
    stays out of routing, vLLM's label names no version, and an admin resume is refused. The
    stream it held cannot continue on weights nobody vouches for: it is ended (vLLM's abort,
    which it reports like a finish) and recorded incomplete, never complete or eligible."""
    version = stack.version()
    wrong_new, wrong_old = (
        reference_scores(reference_with(stack.model_dir, random_delta(stack.model_dir, seed)))
        for seed in (11, 12)
    )
    path = write_delta(random_delta(stack.model_dir, seed=13), tmp_path / "d.safetensors")
    coordinator, plan = stack.next_version(path, reference_new=wrong_new, reference_old=wrong_old)
    stream, first = _held_stream(stack)
    with stack.admin() as admin:  # the gateway's own count of requests it has on each backend
        (busy,) = [b["id"] for b in admin.get("/admin/backends").json() if b["in_flight_here"]]
    (backend,) = [b for b in coordinator.backends(plan.model_id) if b.id == busy]
    (other,) = [b for b in coordinator.backends(plan.model_id) if b.id != busy]
    checksum_before = VllmControl(stack.http, backend.url).rpc("rlgw_checksum")
    report = coordinator.swap_backend(backend, plan)
    coordinator.engine.dispose()
    assert report.outcome == "failed" and "restored weights fail parity" in report.reason
    finish = {c.index: c.finish_reason for part in stream for c in part.choices if c.finish_reason}
    assert "abort" in finish.values(), finish  # the client saw the end
    ids = [first.id] + [f"{first.id}-{i}" for i in range(1, HELD_CHOICES)]
    with stack.admin() as admin:
        ended = [admin.get(f"/admin/completions/{i}").json() for i in ids]
    aborted = [r for r in ended if r["finish_reason"] == "abort"]
    assert aborted and all(len(r["output_token_ids"]) < 1900 for r in aborted)
    for record in aborted:  # cut short: never recorded as complete
        assert record["status"] == "incomplete" and "aborted" in record["status_reason"]
        assert record["eligible"] is False
    for record in ended:  # tokens after the pause came from weights that failed verification
        assert record["eligible"] is False, record["id"]
    label = stack.http.get(f"{backend.url}/weight_info").json()["weight_version"]
    assert label == failed_label(version + 1)
    # The rollback itself was exact: the served weights are bitwise the old ones.
    assert VllmControl(stack.http, backend.url).rpc("rlgw_checksum") == checksum_before
    with stack.admin() as admin:
        listed = {b["id"]: b for b in admin.get("/admin/backends").json()}[backend.id]
        assert listed["state"] == "failed" and "fail parity" in listed["state_reason"]
        refused = admin.post(f"/admin/backends/{backend.id}/resume")
        assert refused.status_code == 409 and refused.json()["error"]["code"] == "version_mismatch"
        served = {admin.get(f"/admin/completions/{chat(stack.gateway).id}").json()["backend"]}
        assert served == {other.id}  # traffic goes to the other backend only
        # An operator who has checked the weights labels them and resumes the backend.
        stack.http.post(
            f"{backend.url}/update_weight_version", json={"new_version": str(version)}
        ).raise_for_status()
        resumed = admin.post(f"/admin/backends/{backend.id}/resume")
        assert resumed.status_code == 200 and resumed.json()["state"] == "active"
    assert (
        served_scores(stack.http, backend.url, MODEL_NAME).max_abs_diff(
            reference_scores(stack.reference())
        )
        <= TOL
    )


def test_a_swap_holds_running_streams_and_they_continue_on_the_new_weights(stack, tmp_path):
    """`rlgw push` while 16 streamed choices of 1,900 tokens run: no swap waits for them or cuts
    them. Each ends complete and eligible, its tokens split where the pause held it: those before
    scored by the old version, the rest by the new one, each exactly (the continuation's prefix
    is recomputed under the new weights, not read from a cache the old weights computed)."""
    old = stack.version()
    stream, first = _held_stream(stack)
    reports = stack.push_delta(seed=21, tmp=tmp_path)
    assert [r.outcome for r in reports] == ["swapped", "swapped"], [r.reason for r in reports]
    assert sum(r.held or 0 for r in reports) >= HELD_CHOICES  # the backend said what it held
    assert all("drain" not in r.steps for r in reports)  # nothing was waited for
    finish = {c.index: c.finish_reason for part in stream for c in part.choices if c.finish_reason}
    assert finish == dict.fromkeys(range(HELD_CHOICES), "length"), finish
    ids = [first.id] + [f"{first.id}-{i}" for i in range(1, HELD_CHOICES)]
    held = [r for r in records(stack.db_url) if r.id in ids]
    assert len(held) == HELD_CHOICES
    references = {v: stack.reference(upto=v) for v in (old, old + 1)}
    crossed = 0
    for record in held:
        prompt, output = unpack_ids(record.prompt_token_ids), unpack_ids(record.output_token_ids)
        assert record.status == "complete" and len(output) == 1900
        assert not record.ineligible_reasons, record.ineligible_reasons
        versions = record.output_versions or [record.policy_version] * len(output)
        assert len(versions) == 1900 and versions == sorted(versions)
        assert set(versions) <= {old, old + 1} and versions[0] == record.policy_version
        cut = versions.count(old)
        served = np.asarray(unpack_logprobs(record.output_logprobs))
        before = np.asarray(output_logprobs(references[old], prompt, output))
        after = np.asarray(output_logprobs(references[old + 1], prompt, output))
        assert np.abs(served[:cut] - before[:cut]).max(initial=0.0) <= TOL, record.id
        assert np.abs(served[cut:] - after[cut:]).max(initial=0.0) <= TOL, record.id
        if 0 < cut < 1900:
            assert np.abs(served[cut:] - before[cut:]).max() > 1e-3  # the versions differ
            crossed += 1
    print(f"held at token {[(r.output_versions or []).count(old) for r in held]} of 1900")
    assert crossed > 0  # the pause held them mid-answer


def _answer_400(base: str, streamed: bool, out: dict, key: int) -> None:
    """One 400-token answer at temperature 1, streamed or whole: its id(s) and finish in `out`."""
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    body = {
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": f"Answer {key}, at length."}],
        "max_tokens": 400,
        "temperature": 1.0,
        "extra_body": {"ignore_eos": True},
    }
    try:
        if streamed:
            ids, finish = set(), None
            for chunk in client.chat.completions.create(stream=True, **body):
                ids.add(chunk.id)
                finish = next((c.finish_reason for c in chunk.choices if c.finish_reason), finish)
            out[key] = (ids, finish)
        else:
            reply = client.chat.completions.create(**body)
            out[key] = ({reply.id}, reply.choices[0].finish_reason)
    except Exception as exc:  # asserted on by the test
        out[key] = (set(), repr(exc))


def test_a_swap_during_8_streamed_and_8_whole_answers_of_400_tokens_loses_none(stack, tmp_path):
    """The issue's fault case: 8 streamed and 8 whole answers of 400 tokens are running when the
    weights change. Each client sees one uninterrupted answer with one id; each record is
    complete and eligible, every token scored by the version it names (checked against both)."""
    old = stack.version()
    stack.stage_gate.unlink()  # the first backend's stage waits: the answers start meanwhile
    pushed: list = []
    pusher = threading.Thread(target=lambda: pushed.append(stack.push_delta(31, tmp_path)))
    pusher.start()
    answers: dict[int, tuple[set[str], str | None]] = {}
    try:
        with stack.admin() as admin:
            _wait_for(
                lambda: any(b["state"] != "active" for b in admin.get("/admin/backends").json()),
                timeout_s=120.0,
            )
        clients = [
            threading.Thread(target=_answer_400, args=(stack.gateway, i < 8, answers, i))
            for i in range(16)
        ]
        for client in clients:
            client.start()
        time.sleep(0.5)  # all sent: the release below starts the swaps while they run
    finally:
        stack.stage_gate.touch()
    pusher.join(timeout=300)
    for client in clients:
        client.join(timeout=300)
    (reports,) = pushed
    assert [r.outcome for r in reports] == ["swapped", "swapped"], [r.reason for r in reports]
    assert sorted(answers) == list(range(16))
    for key, (ids, finish) in answers.items():
        assert len(ids) == 1 and finish == "length", (key, ids, finish)  # one answer, one id
    ids = {next(iter(ids)) for ids, _ in answers.values()}
    held = [r for r in records(stack.db_url) if r.id in ids]
    assert len(held) == 16
    references = {v: stack.reference(upto=v) for v in (old, old + 1)}
    crossed = 0
    for record in held:
        prompt, output = unpack_ids(record.prompt_token_ids), unpack_ids(record.output_token_ids)
        assert record.status == "complete" and len(output) == 400
        assert not record.ineligible_reasons, (record.id, record.ineligible_reasons)
        versions = record.output_versions or [record.policy_version] * len(output)
        assert versions == sorted(versions) and set(versions) <= {old, old + 1}
        served = np.asarray(unpack_logprobs(record.output_logprobs))
        for version, reference in references.items():
            at = np.asarray([v == version for v in versions])
            scored = np.asarray(output_logprobs(reference, prompt, output))
            assert np.abs(served - scored)[at].max(initial=0.0) <= TOL, (record.id, version)
        crossed += len(set(versions)) > 1
    print(f"{crossed} of 16 answers continued across the swap")
    assert crossed > 0


def test_a_client_that_leaves_during_the_continuation_leaves_nothing_behind(stack, tmp_path):
    """A stream held by a swap and continued on the new weights; its client hangs up: its records
    are incomplete (never trained on), their tokens so far keep their versions, the backend ends
    the requests, and the next call is served and eligible."""
    old = stack.version()
    # 16 choices of 1,900 tokens: seconds of work, so the pause holds them (a single choice of
    # this tiny model can finish, into the sockets' buffers, before the push pauses the backend).
    stream, first = _held_stream(stack)
    chunks = iter(stream)
    reports = stack.push_delta(seed=41, tmp=tmp_path)
    assert [r.outcome for r in reports] == ["swapped", "swapped"]
    assert sum(r.held or 0 for r in reports) >= HELD_CHOICES  # held mid-answer, not finished
    for _ in range(40):  # the continuation, on the new weights
        next(chunks)
    stream.close()  # the client hangs up
    for url in stack.backends:
        _wait_for(lambda u=url: VllmControl(stack.http, u).requests_in_flight() == 0, 60)
    ids = [first.id] + [f"{first.id}-{i}" for i in range(1, HELD_CHOICES)]
    with stack.admin() as admin:
        deadline = time.monotonic() + 30
        while any(admin.get(f"/admin/completions/{i}").status_code != 200 for i in ids):
            assert time.monotonic() < deadline
            time.sleep(0.2)
        for i in ids:
            record = admin.get(f"/admin/completions/{i}").json()
            assert record["status"] == "incomplete", record["id"]
            assert "client disconnected" in record["status_reason"], record["status_reason"]
            assert record["eligible"] is False
        after = admin.get(f"/admin/completions/{chat(stack.gateway).id}").json()
    assert after["eligible"] is True and after["policy_version"] == old + 1
    rows = [r for r in records(stack.db_url) if r.id in ids]
    crossed = 0
    for row in rows:
        output = unpack_ids(row.output_token_ids)
        assert len(output) < 1900, row.id  # cut short by the hang-up
        versions = row.output_versions or [row.policy_version] * len(output)
        assert len(versions) == len(output) and versions == sorted(versions), row.id
        assert set(versions) <= {old, old + 1}
        crossed += versions[0] == old and versions[-1] == old + 1
    assert crossed > 0  # tokens before the pause keep the old version, the rest the new one


def _traffic(base: str, stop: threading.Event, outcomes: list, **kwargs) -> None:
    while not stop.is_set():
        started = time.monotonic()
        try:
            reply_id = chat(base, **kwargs).id
            outcomes.append(("ok", reply_id, started, time.monotonic()))
        except Exception as exc:  # recorded and asserted on by the test
            outcomes.append(("error", repr(exc), started, time.monotonic()))


def test_swap_under_load_stamps_every_token_with_the_version_that_made_it(stack, tmp_path):
    before = {r.id for r in records(stack.db_url)}
    stop, outcomes, stream_ids, stream_errors = threading.Event(), [], [], []

    def long_stream() -> None:
        client = openai.OpenAI(base_url=f"{stack.gateway}/v1", api_key="unused", max_retries=0)
        try:
            for chunk in client.chat.completions.create(
                model=MODEL_NAME,
                messages=[{"role": "user", "content": "Go on."}],
                max_tokens=1200,
                stream=True,
                extra_body={"ignore_eos": True},
            ):
                stream_ids.append(chunk.id)
        except Exception as exc:  # asserted on below: a swap must not cut it
            stream_errors.append(exc)

    threads = [threading.Thread(target=long_stream)] + [
        threading.Thread(target=_traffic, args=(stack.gateway, stop, outcomes)) for _ in range(2)
    ]
    for t in threads:
        t.start()
    time.sleep(0.5)
    reports = stack.push_delta(seed=2, tmp=tmp_path)
    time.sleep(0.5)
    stop.set()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert [r.outcome for r in reports] == ["swapped", "swapped"]
    assert all(kind == "ok" for kind, *_ in outcomes), outcomes

    new = [r for r in records(stack.db_url) if r.id not in before]
    # The long stream was running when its backend paused: held, not cut, it continued on the
    # new weights and is complete and eligible, one version per token (checked below).
    (streamed,) = [r for r in new if r.id == stream_ids[0]]
    assert not stream_errors, stream_errors
    assert streamed.status == "complete" and not streamed.ineligible_reasons
    assert len(unpack_ids(streamed.output_token_ids)) == 1200
    versions = {r.policy_version for r in new}
    assert versions <= {stack.version() - 1, stack.version()}, versions
    references = {v: stack.reference(upto=v) for v in (stack.version() - 1, stack.version())}
    checked = crossed = 0
    for rec in new:
        assert not rec.ineligible_reasons, (rec.id, rec.ineligible_reasons)
        prompt, output = unpack_ids(rec.prompt_token_ids), unpack_ids(rec.output_token_ids)
        recorded = np.asarray(unpack_logprobs(rec.output_logprobs))
        per_token = rec.output_versions or [rec.policy_version] * len(output)
        crossed += len(set(per_token)) > 1
        for version, reference in references.items():
            at = np.asarray([v == version for v in per_token])
            scored = np.asarray(output_logprobs(reference, prompt, output))
            assert np.abs(recorded - scored)[at].max(initial=0.0) <= TOL, (rec.id, version)
            assert np.abs(recorded - scored)[~at].max(initial=1.0) > 1e-3, (rec.id, version)
        checked += 1
    assert checked >= 4


# A gateway learns of a registry change by NOTIFY (milliseconds), else by its periodic re-read.
PROPAGATION_BOUND_S = Settings().backend_refresh_s + 1.0


def _routing_window(heard: list[dict], after: float) -> tuple[float, float]:
    """When this gateway learnt that the backend left routing (the first non-active state it
    heard after `after`, Unix time) and when it learnt it was back (the next active one)."""
    left = next(h["at"] for h in heard if h["at"] > after and h["state"] != "active")
    back = next(h["at"] for h in heard if h["at"] > left and h["state"] == "active")
    return left, back


def test_traffic_continues_through_the_other_backend_during_a_swap(stack, tmp_path):
    """A request the gateway routes after it learnt that a backend left routing is never sent
    there; a request sent there before is held by the pause and completes, never cut. When the
    gateway learns is measured (its own log of the registry changes it heard), and the delay
    from the coordinator's write is bounded: it is not assumed to be zero."""
    wall_minus_mono = time.time() - time.monotonic()  # the coordinator's clock is monotonic
    stop, outcomes = threading.Event(), []
    workers = [
        threading.Thread(target=_traffic, args=(stack.gateway, stop, outcomes)) for _ in range(3)
    ]
    for worker in workers:
        worker.start()
    time.sleep(0.3)
    # The first backend's stage is held open until requests have completed meanwhile, so the
    # window it is out of routing outlasts a request on a loaded machine too.
    stack.stage_gate.unlink()
    pushed: list = []
    pusher = threading.Thread(target=lambda: pushed.append(stack.push_delta(3, tmp_path)))
    pusher.start()
    try:
        with stack.admin() as admin:
            _wait_for(
                lambda: any(b["state"] != "active" for b in admin.get("/admin/backends").json()),
                timeout_s=120.0,
            )
        held_from = len(outcomes)
        _wait_for(lambda: len(outcomes) >= held_from + 6, timeout_s=120.0)
    finally:
        stack.stage_gate.touch()
    pusher.join(timeout=300)
    (reports,) = pushed
    time.sleep(0.3)
    stop.set()
    for worker in workers:
        worker.join(timeout=60)
    assert [r.outcome for r in reports] == ["swapped", "swapped"]
    assert outcomes and all(kind == "ok" for kind, *_ in outcomes), outcomes
    for report in reports:  # the other backend served: the stage ran out of routing
        assert report.staged_out_of_routing
        assert report.out_of_routing[0] <= report.stage_window[0]
        assert report.stage_window[1] <= report.out_of_routing[1]
    routed_elsewhere = held = 0
    with stack.admin() as admin:
        heard = {b["id"]: b["heard_here"] for b in admin.get("/admin/backends").json()}
        served = {
            completion_id: admin.get(f"/admin/completions/{completion_id}").json()
            for _, completion_id, _, _ in outcomes
        }
        for report in reports:
            written = report.out_of_routing[0] + wall_minus_mono
            left, back = _routing_window(heard[report.backend_id], written)
            delay = left - written
            assert 0 <= delay <= PROPAGATION_BOUND_S, f"heard {delay:.3f}s after the write"
            print(f"backend {report.backend_id}: heard it leave routing {delay * 1000:.1f} ms late")
            for _, completion_id, started, ended in outcomes:
                started, ended = started + wall_minus_mono, ended + wall_minus_mono
                record = served[completion_id]
                if started >= left and ended <= back:  # routed while it knew it was out
                    assert record["backend"] != report.backend_id, record
                    routed_elsewhere += 1
                elif record["backend"] == report.backend_id and started < left < ended:
                    assert record["status"] == "complete", record  # held, not cut
                    held += 1
    assert routed_elsewhere > 0  # requests were served while a backend was being swapped
    print(f"{routed_elsewhere} routed elsewhere, {held} held across the change")


def test_a_backend_reporting_another_version_stays_out_of_routing(stack):
    with stack.admin() as admin:
        backend = admin.get("/admin/backends").json()[0]
        assert admin.post(f"/admin/backends/{backend['id']}/drain").json()["state"] == "draining"
        stack.http.post(f"{backend['url']}/update_weight_version", json={"new_version": "bogus"})
        reply = admin.post(f"/admin/backends/{backend['id']}/resume")
        assert reply.status_code == 409 and reply.json()["error"]["code"] == "version_mismatch"
        listed = {b["id"]: b for b in admin.get("/admin/backends").json()}[backend["id"]]
        assert listed["state"] == "draining"
        stack.http.post(
            f"{backend['url']}/update_weight_version",
            json={"new_version": str(backend["served_version"])},
        )
        assert admin.post(f"/admin/backends/{backend['id']}/resume").json()["state"] == "active"


def _drop_registry_listeners(conn) -> None:
    """Terminate every gateway's registry listener connection (they reconnect by themselves)."""
    conn.execute(
        text(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = 'rlgw-registry-listener' "
            "AND datname = current_database()"
        )
    )


def _replica_state(stack: Stack, backend_id: int) -> str:
    with httpx.Client(base_url=stack.replica) as http:
        return {b["id"]: b["state"] for b in http.get("/healthz").json()["backends"]}[backend_id]


def _wait_for(predicate, timeout_s: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if predicate():
            return time.monotonic() - t0
        time.sleep(0.02)
    raise AssertionError("condition not met in time")


def test_a_replica_learns_of_a_drain_at_once(stack):
    with stack.admin() as admin:
        backend_id = admin.get("/admin/backends").json()[0]["id"]
        admin.post(f"/admin/backends/{backend_id}/drain")
        # The replica polls only every 60 s: seeing it within a second means NOTIFY worked.
        _wait_for(lambda: _replica_state(stack, backend_id) == "draining", timeout_s=1.0)
        replies = [chat(stack.replica).id for _ in range(4)]
        assert {admin.get(f"/admin/completions/{r}").json()["backend"] for r in replies} == {
            b["id"] for b in admin.get("/admin/backends").json()
        } - {backend_id}
        admin.post(f"/admin/backends/{backend_id}/resume")
        _wait_for(lambda: _replica_state(stack, backend_id) == "active", timeout_s=1.0)


def test_a_replica_rereads_the_registry_after_losing_its_connection(stack):
    with stack.admin() as admin:
        backend_id = admin.get("/admin/backends").json()[0]["id"]
    engine = create_engine(stack.db_url)
    with engine.begin() as conn:  # a change nobody is told about, while the listeners drop
        conn.execute(
            text("UPDATE backends SET state = 'draining' WHERE id = :id"), {"id": backend_id}
        )
        _drop_registry_listeners(conn)
    _wait_for(lambda: _replica_state(stack, backend_id) == "draining", timeout_s=10.0)
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE backends SET state = 'active' WHERE id = :id"), {"id": backend_id}
        )
        conn.execute(text("SELECT pg_notify('rlgw_backends', :id)"), {"id": str(backend_id)})
    engine.dispose()
    _wait_for(lambda: _replica_state(stack, backend_id) == "active", timeout_s=5.0)


def test_a_swap_missed_while_the_registry_connection_was_lost_excludes_the_request(stack):
    """A swap this gateway did not hear of (its listener was away; here the epochs are bumped
    without a NOTIFY) is found in the registry, by the re-read after reconnecting or by the
    record's write: a request in flight across it is recorded but excluded."""
    client = openai.OpenAI(base_url=f"{stack.gateway}/v1", api_key="unused", max_retries=0)
    stream = client.chat.completions.create(
        model=MODEL_NAME,
        messages=[{"role": "user", "content": "Tell me a long story"}],
        max_tokens=1500,  # its events outgrow the sockets' buffers: unread, it cannot end
        stream=True,
        extra_body={"ignore_eos": True},
    )
    first = next(iter(stream))
    engine = create_engine(stack.db_url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE backends SET swap_epoch = swap_epoch + 1"))
        _drop_registry_listeners(conn)
    engine.dispose()
    for _ in stream:
        pass
    with stack.admin() as admin:
        deadline = time.monotonic() + 60  # ends as soon as it has reconnected
        while not admin.get("/healthz").json()["registry"]["following"]:  # reconnected
            assert time.monotonic() < deadline
            time.sleep(0.2)
        after = chat(stack.gateway)
        spanning = admin.get(f"/admin/completions/{first.id}").json()
        fresh = admin.get(f"/admin/completions/{after.id}").json()
    assert spanning["status"] == "complete" and len(spanning["output_token_ids"]) == 1500
    assert spanning["eligible"] is False
    assert "crossed a weight swap" in spanning["eligibility_reason"]
    assert fresh["eligible"] is True, fresh["eligibility_reason"]
