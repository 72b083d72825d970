"""LoRA versions end to end, on real Postgres and a real vLLM CPU server started with the LoRA
flags: rewarded completions recorded through the gateway train an adapter, which is swapped in
under its versioned name and verified; the next completion (plain model name) is served by it
and stamped with its version; an adapter the server refuses, or one that fails parity, leaves
traffic on the old version; and export merges the adapter into a checkpoint transformers loads
with the served log-probs."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import torch
from safetensors.torch import load_file, save_file
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session

from gateway.main import create_app
from migrations.runner import upgrade
from rlgw.db.engine import make_sync_engine, sync_session_factory
from rlgw.db.models import Backend, PolicyVersion, RegisteredModel
from rlgw.registry import register_backend
from trainer.backends.parity import reference_scores, served_scores
from trainer.config import TrainerConfig
from trainer.loop.service import OnlineTrainer
from trainer.models.weights import load_reference_model
from trainer.publishing.export_model import export_model
from trainer.publishing.publish import Publisher
from trainer.swap.coordinator import SwapPlan
from trainer.weight_update.lora import LoraAdapter

from conftest import (
    ADMIN_KEY,
    MODEL_NAME,
    LiveServer,
    fetch_record,
    free_port,
    gateway_settings,
    start_vllm_servers,
    stop_vllm_servers,
)
from swap_helpers import output_logprobs, random_adapter

RANK = 8  # the server's --max-lora-rank is 8 too
TOLERANCE = 1e-4  # fp32 parity


class Env:
    def __init__(self, db_url: str, backend: str, gateway: str, home: Path, model_dir: Path):
        self.db_url, self.backend, self.gateway, self.model_dir = (
            db_url,
            backend,
            gateway,
            model_dir,
        )
        self.settings = gateway_settings(db_url).model_copy(update={"home": home})
        self.http = httpx.Client(base_url=gateway, timeout=120)
        self.admin = httpx.Client(
            base_url=gateway, timeout=30, headers={"Authorization": f"Bearer {ADMIN_KEY}"}
        )

    def episode(self, reward: float) -> str:
        """One rewarded, closed session with one completion through the gateway."""
        s = self.http.post("/v1/sessions", json={}).json()
        openai.OpenAI(base_url=s["base_url"], api_key="unused").chat.completions.create(
            model=MODEL_NAME,
            messages=[{"role": "user", "content": "Say A"}],
            max_tokens=6,
            temperature=1.0,
        )
        assert self.http.post(f"/v1/sessions/{s['id']}/rewards", json={"value": reward}).is_success
        self.http.post(f"/v1/sessions/{s['id']}/close")
        return s["id"]

    def complete(self) -> tuple[dict, dict]:
        """A completion through the gateway under the plain model name: (reply, its record)."""
        reply = self.http.post(
            "/v1/chat/completions",
            json={
                "model": MODEL_NAME,
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 5,
            },
        ).json()
        return reply, fetch_record(self.admin, reply["id"])

    def trainer(self) -> OnlineTrainer:
        config = TrainerConfig(lr=2e-2, batch_sessions=16, lora_rank=RANK)
        return OnlineTrainer(self.settings, make_sync_engine(self.db_url), MODEL_NAME, config)

    def db(self) -> Session:
        return Session(create_engine(self.db_url))

    def backend_row(self) -> Backend:
        with self.db() as db:
            return db.scalars(select(Backend)).one()

    def adapters(self) -> list[str]:
        models = httpx.get(f"{self.backend}/v1/models", timeout=10).json()["data"]
        return sorted(m["id"] for m in models if m["id"] != MODEL_NAME)


@pytest.fixture(scope="module")
def env(make_database, tiny_model_dir, tmp_path_factory) -> Iterator[Env]:
    db_url = make_database()
    upgrade(db_url)
    logs = tmp_path_factory.mktemp("lora-logs")
    servers = start_vllm_servers(tiny_model_dir, logs, lora_rank=RANK)
    engine = make_sync_engine(db_url)
    register_backend(
        sync_session_factory(engine), MODEL_NAME, servers[0][1], model_path=str(tiny_model_dir)
    )
    engine.dispose()
    try:
        with LiveServer(create_app(gateway_settings(db_url)), free_port()) as gw:
            yield Env(
                db_url, servers[0][1], gw.url, tmp_path_factory.mktemp("home"), tiny_model_dir
            )
    finally:
        stop_vllm_servers(servers)


@pytest.fixture(scope="module")
def trained(env: Env) -> Iterator[OnlineTrainer]:
    """Two LoRA versions trained from recorded rewarded completions and swapped in."""
    trainer = env.trainer()
    for rewards in ((1.0, 0.0, 0.5, 1.0), (0.0, 1.0, 1.0)):
        for reward in rewards:
            env.episode(reward)
        report = trainer.step()
        assert report is not None and [s.outcome for s in report.swaps] == ["swapped"]
        assert [s.kind for s in report.swaps] == ["lora"]
    yield trainer
    trainer.close()


def test_a_lora_version_is_swapped_in_verified_and_the_old_adapter_unloaded(env, trained):
    assert trained.version == 2
    with env.db() as db:
        rows = db.scalars(select(PolicyVersion).where(PolicyVersion.version > 0)).all()
        lora = db.scalar(select(RegisteredModel.lora))
    assert [r.kind for r in rows] == ["lora", "lora"] and lora["rank"] == RANK
    assert (Path(rows[-1].weights_path) / "adapter_config.json").is_file()
    assert env.adapters() == [f"{MODEL_NAME}@v2"]  # v1 unloaded when v2 was committed
    served = served_scores(httpx.Client(), env.backend, f"{MODEL_NAME}@v2")
    assert served.max_abs_diff(reference_scores(trained.model)) <= TOLERANCE
    base = served_scores(httpx.Client(), env.backend, MODEL_NAME)
    assert base.max_abs_diff(served) > 100 * TOLERANCE  # the adapter really changes the model
    full_bytes = sum(p.numel() * 4 for p in load_reference_model(env.model_dir).parameters())
    assert rows[-1].metrics["bytes"] < full_bytes


def test_the_next_completion_under_the_plain_name_is_served_by_the_adapter(env, trained):
    reply, record = env.complete()
    assert reply["model"] == MODEL_NAME
    assert record["policy_version"] == trained.version
    prompt, output = record["prompt_token_ids"], record["output_token_ids"]
    adapted = output_logprobs(trained.model, prompt, output)
    base = output_logprobs(load_reference_model(env.model_dir), prompt, output)
    recorded = record["output_logprobs"]
    assert max(abs(a - b) for a, b in zip(recorded, adapted, strict=True)) <= TOLERANCE
    assert max(abs(a - b) for a, b in zip(recorded, base, strict=True)) > 10 * TOLERANCE


def _plan(trainer: OnlineTrainer, update: LoraAdapter, reference) -> SwapPlan:
    return SwapPlan(
        model_name=MODEL_NAME,
        model_id=trainer.publisher.model.id,
        parent_version=trainer.version,
        new_version=update.version,
        update=update,
        reference_new=reference_scores(reference),
        reference_old=reference_scores(trainer.model),
    )


def _adapter_of_rank(env: Env, rank: int, path: Path, seed: int) -> torch.nn.Module:
    """A peft model with a random (non-zero) adapter of `rank`, saved at `path`."""
    model = random_adapter(env.model_dir, rank=rank, seed=seed)
    model.save_pretrained(str(path))
    return model


def _assert_traffic_stays_on(env: Env, trainer: OnlineTrainer, refused: str) -> None:
    row = env.backend_row()
    assert row.state == "active" and row.served_version == trainer.version
    assert refused not in env.adapters()
    _, record = env.complete()
    assert record["policy_version"] == trainer.version
    served = served_scores(httpx.Client(), env.backend, f"{MODEL_NAME}@v{trainer.version}")
    assert served.max_abs_diff(reference_scores(trainer.model)) <= TOLERANCE


def test_an_adapter_above_the_servers_max_rank_is_refused_and_traffic_stays(env, trained, tmp_path):
    reference = _adapter_of_rank(env, 4 * RANK, tmp_path / "big", seed=1)
    update = LoraAdapter(tmp_path / "big", MODEL_NAME, 90)
    report = trained.publisher.coordinator.swap_backend(
        env.backend_row(), _plan(trained, update, reference)
    )
    assert report.outcome == "refused", report.reason
    assert "load_lora_adapter" in report.reason
    _assert_traffic_stays_on(env, trained, update.name)


def test_an_adapter_with_corrupted_weights_is_refused_and_traffic_stays(env, trained, tmp_path):
    reference = _adapter_of_rank(env, RANK, tmp_path / "nan", seed=2)
    weights = tmp_path / "nan" / "adapter_model.safetensors"
    tensors = load_file(str(weights))
    tensors = {k: torch.full_like(v, float("nan")) for k, v in tensors.items()}
    save_file(tensors, str(weights))
    update = LoraAdapter(tmp_path / "nan", MODEL_NAME, 91)
    report = trained.publisher.coordinator.swap_backend(
        env.backend_row(), _plan(trained, update, reference)
    )
    assert report.outcome == "refused" and "NaN" in report.reason
    _assert_traffic_stays_on(env, trained, update.name)


def test_an_adapter_that_fails_parity_is_rolled_back_and_unloaded(env, trained, tmp_path):
    _adapter_of_rank(env, RANK, tmp_path / "served", seed=3)
    claimed = _adapter_of_rank(env, RANK, tmp_path / "claimed", seed=4)  # not what is shipped
    update = LoraAdapter(tmp_path / "served", MODEL_NAME, 92)
    report = trained.publisher.coordinator.swap_backend(
        env.backend_row(), _plan(trained, update, claimed)
    )
    assert report.outcome == "rolled_back" and "parity failed" in report.reason
    _assert_traffic_stays_on(env, trained, update.name)


def test_export_merges_the_adapter_into_a_checkpoint_with_the_served_logprobs(
    env, trained, tmp_path
):
    out = export_model(
        make_sync_engine(env.db_url), MODEL_NAME, trained.version, tmp_path / "export"
    )
    from transformers import AutoModelForCausalLM

    exported = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    assert not any("lora" in name for name, _ in exported.named_parameters())
    served = served_scores(httpx.Client(), env.backend, f"{MODEL_NAME}@v{trained.version}")
    assert reference_scores(exported).max_abs_diff(served) <= TOLERANCE


def test_a_trainer_with_other_lora_settings_is_refused(env, trained):
    from trainer.errors import LoraMismatch

    with pytest.raises(LoraMismatch, match="LoRA rank 8"):
        OnlineTrainer(
            env.settings,
            make_sync_engine(env.db_url),
            MODEL_NAME,
            TrainerConfig(lora_rank=2 * RANK),
        )


def test_rlgw_up_starts_a_lora_model_in_its_recorded_mode_and_refuses_another(env, trained):
    import argparse

    from rlgw_cli.lora import lora_argv, lora_mode
    from rlgw_cli.output import CommandError

    def flags(rank=None) -> argparse.Namespace:
        return argparse.Namespace(lora_rank=rank, lora_alpha=None, lora_targets=None)

    spec = lora_mode(env.db_url, MODEL_NAME, flags())  # no flags: the recorded adapter
    assert spec is not None and spec.rank == RANK
    assert lora_argv(spec)[:2] == ["--lora-rank", str(RANK)]
    with pytest.raises(CommandError, match="LoRA rank 8"):
        lora_mode(env.db_url, MODEL_NAME, flags(2 * RANK))


def test_rlgw_push_refuses_a_lora_model(env, trained, tmp_path):
    from trainer.errors import BadUpdate
    from trainer.models.weights import write_update
    from trainer.publishing.push import push

    path = tmp_path / "delta.safetensors"
    write_update({"model.norm.weight": torch.zeros(64)}, path)
    with pytest.raises(BadUpdate, match="LoRA"):
        push(env.settings, env.db_url, MODEL_NAME, delta=path)


def test_two_trainer_processes_train_a_lora_version_that_passes_the_swap(env, trained):
    """`rlgw train --nproc 2` on a LoRA model (its recorded mode, no flags): the adapter is
    replicated over two gloo ranks (DDP), rank 0 alone claims, records and swaps it in, and the
    backend serves it under its versioned name with the version's own log-probs."""
    for reward in (1.0, 0.0, 0.5, 1.0):
        env.episode(reward)
    with env.db() as db:
        before = db.scalar(select(RegisteredModel.current_version))
    home = str(env.settings.home)
    environment = {**os.environ, "RLGW_DATABASE_URL": env.db_url, "RLGW_HOME": home}
    done = subprocess.run(
        [sys.executable, "-m", "rlgw_cli", "train", "--model", MODEL_NAME]
        + ["--max-versions", "1", "--batch-sessions", "16", "--nproc", "2"],
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "2 process(es), LoRA rank 8" in done.stdout, done.stdout[-2000:]
    assert "[swapped]" in done.stdout, done.stdout[-2000:]
    with env.db() as db:
        now = db.scalar(select(RegisteredModel.current_version))
        kind = db.scalar(select(PolicyVersion.kind).where(PolicyVersion.version == now))
    assert (now, kind) == (before + 1, "lora")
    assert env.adapters() == [f"{MODEL_NAME}@v{now}"]
    with Publisher(env.settings, make_sync_engine(env.db_url), MODEL_NAME) as publisher:
        reference = publisher.latest()[1]  # the recorded version, rebuilt from its folder
    served = served_scores(httpx.Client(), env.backend, f"{MODEL_NAME}@v{now}")
    assert served.max_abs_diff(reference_scores(reference)) <= TOLERANCE


def test_a_lora_swap_with_an_answer_in_flight_keeps_the_backend_alive(env, trained, monkeypatch):
    """A LoRA version is swapped in while 8 long answers run on the served adapter: the swap
    lets them finish on their adapter (their version) before the parity probe (in the learning
    benchmark, 24 sessions in flight, a probe batched with them killed vLLM 0.32's CPU engine;
    this test does not reproduce that crash, it checks the answers and the swap). Each answer
    is complete and eligible at the old version, the new version serves next."""
    version = env.backend_row().served_version  # another trainer may have pushed meanwhile
    client = openai.OpenAI(base_url=f"{env.http.base_url}/v1", api_key="unused", max_retries=0)
    stream = client.chat.completions.create(
        model=MODEL_NAME,
        messages=[{"role": "user", "content": "Go on."}],
        max_tokens=1500,
        n=8,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    first = next(iter(stream))
    for reward in (1.0, 0.0, 0.5, 1.0):
        env.episode(reward)
    # The swap waits for the 8 answers of 1,500 tokens, however slow the machine: the default
    # drain timeout (30 s) was once too short for them on a busy CI machine (they were aborted).
    monkeypatch.setattr(trained.publisher.coordinator, "drain_timeout_s", 900.0)
    report = trained.step()
    assert report is not None and [s.outcome for s in report.swaps] == ["swapped"], [
        s.reason for s in report.swaps
    ]
    finish = [c.finish_reason for part in stream for c in part.choices if c.finish_reason]
    assert finish == ["length"] * 8
    for choice in [first.id] + [f"{first.id}-{i}" for i in range(1, 8)]:
        record = fetch_record(env.admin, choice)
        assert record["status"] == "complete" and len(record["output_token_ids"]) == 1500
        assert record["eligible"] is True and record["policy_version"] == version
        assert set(record["output_versions"]) == {version}
    _, after = env.complete()
    assert after["policy_version"] == env.backend_row().served_version > version
