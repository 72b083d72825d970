"""The update's guards and what it measures: nothing non-finite is ever stepped (weights and
AdamW state come back exactly), several passes let the PPO clip bind, dropout is off and the LM
head runs in fp32 when the trainer scores tokens, and the first pass's entropy and KL split."""

from __future__ import annotations

import copy

import pytest
import torch
from update_fixtures import PAD_ID, random_samples, tiny_model, weights

from rlgw.test_hooks import NAN_LOSS_ENV, nan_loss
from trainer.config import TrainerConfig
from trainer.loop.device import prepare_model
from trainer.loop.loss import decoupled_ppo_loss, token_logprobs
from trainer.loop.samples import Sample, collate
from trainer.loop.scoring import scoring_mode
from trainer.loop.update import NonFiniteUpdate, policy_update
from trainer.models.byte_model import PRESETS, build_config
from trainer.models.weights import load_reference_model


def config(**fields) -> TrainerConfig:
    return TrainerConfig(**{"max_tokens_per_sample": 48, "lr": 1e-3, **fields})


def adamw(model: torch.nn.Module) -> torch.optim.AdamW:
    return torch.optim.AdamW(model.parameters(), lr=1e-3)


def optimizer_state(optimizer: torch.optim.Optimizer) -> dict:
    return copy.deepcopy(optimizer.state_dict())


def assert_same_state(a: dict, b: dict) -> None:
    assert a["state"].keys() == b["state"].keys()
    for key, moments in a["state"].items():
        for name, value in moments.items():
            assert torch.equal(value, b["state"][key][name]), (key, name)
    assert [g["lr"] for g in a["param_groups"]] == [g["lr"] for g in b["param_groups"]]


@pytest.mark.parametrize("minibatches, epochs, poisoned", [(1, 1, 1), (2, 1, 2), (2, 2, 4)])
def test_a_nan_loss_changes_neither_the_weights_nor_the_moments(
    monkeypatch, minibatches, epochs, poisoned
) -> None:
    """One earlier update gives AdamW real moments; then the loss of step `poisoned` is NaN:
    with several steps, earlier ones were taken and are undone."""
    model, samples = tiny_model(), random_samples(8)
    optimizer = adamw(model)
    policy_update(model, optimizer, samples, config(), PAD_ID, scheduled=True)
    before, state = weights(model), optimizer_state(optimizer)
    monkeypatch.setenv(NAN_LOSS_ENV, str(poisoned))
    cfg = config(minibatches=minibatches, epochs=epochs)
    with pytest.raises(NonFiniteUpdate, match=f"loss of optimizer step {poisoned} of") as err:
        policy_update(model, optimizer, samples, cfg, PAD_ID, scheduled=True, loss_hook=nan_loss)
    assert err.value.steps_taken == poisoned - 1
    after = weights(model)
    assert all(torch.equal(after[k], before[k]) for k in before)
    assert_same_state(optimizer_state(optimizer), state)
    assert all(p.grad is None for p in model.parameters())
    monkeypatch.delenv(NAN_LOSS_ENV)
    policy_update(
        model, optimizer, samples, cfg, PAD_ID, scheduled=True, loss_hook=nan_loss
    )  # trains again
    assert any(not torch.equal(weights(model)[k], before[k]) for k in before)


def test_a_fresh_adamw_stays_fresh_when_its_first_update_is_refused(monkeypatch) -> None:
    model, samples = tiny_model(), random_samples(8)
    optimizer = adamw(model)
    before = weights(model)
    monkeypatch.setenv(NAN_LOSS_ENV, "2")
    with pytest.raises(NonFiniteUpdate):
        policy_update(
            model,
            optimizer,
            samples,
            config(minibatches=2),
            PAD_ID,
            scheduled=True,
            loss_hook=nan_loss,
        )
    assert optimizer.state_dict()["state"] == {}
    assert all(torch.equal(weights(model)[k], before[k]) for k in before)


def test_a_huge_advantage_is_refused_before_it_reaches_the_weights() -> None:
    """An advantage near float32's limit (an overflowing reward) makes the loss infinite; one
    beyond it is refused earlier, by build_samples (tests/unit/test_samples.py)."""
    model, samples = tiny_model(), random_samples(4)
    samples[1] = Sample(*[getattr(samples[1], f) for f in ("session_id", "completion_id",
        "prompt_ids", "output_ids", "behave_logprobs")], 3e38, 0)  # fmt: skip
    optimizer, before = adamw(model), weights(model)
    with pytest.raises(NonFiniteUpdate, match="non-finite update"):
        policy_update(model, optimizer, samples, config(), PAD_ID)
    assert all(torch.equal(weights(model)[k], before[k]) for k in before)
    assert optimizer.state_dict()["state"] == {}


def test_a_second_pass_is_off_policy_and_equals_two_hand_made_steps() -> None:
    """epochs=2, one minibatch: step 1 on-policy, step 2 against the weights before step 1 (the
    proximal policy), so the ratio departs from 1 and the clip can bind. Reference: the same two
    steps made by hand with SGD."""
    samples, base = random_samples(6, seed=2), tiny_model(2)
    cfg = config(epochs=2, grad_clip=1e9, clip_eps=0.05, max_tokens_per_microbatch=1 << 20)
    ours, hand = copy.deepcopy(base), copy.deepcopy(base)
    metrics = policy_update(ours, torch.optim.SGD(ours.parameters(), lr=3.0), samples, cfg, PAD_ID)
    batch = collate(samples, PAD_ID)

    def logprobs(model):
        logits = model(input_ids=batch.inputs, attention_mask=batch.attention).logits
        return token_logprobs(logits[:, :-1], batch.targets)

    optimizer = torch.optim.SGD(hand.parameters(), lr=3.0)
    prox = logprobs(hand).detach()
    for _ in range(2):
        optimizer.zero_grad()
        loss, _ = decoupled_ppo_loss(
            logprobs(hand), prox, batch.behave, batch.advantages, batch.mask,
            clip_eps=0.05, imp_weight_cap=5.0,
        )  # fmt: skip
        loss.backward()
        optimizer.step()
    for name, value in weights(hand).items():
        assert torch.allclose(weights(ours)[name], value, rtol=1e-5, atol=1e-6), name
    assert metrics["clip_frac"] > 0  # the second pass clipped some tokens
    assert metrics["tokens"] == sum(len(s.output_ids) for s in samples)


def test_the_kl_is_split_by_generating_version_and_the_entropy_is_the_policys() -> None:
    model = tiny_model(4)
    samples = random_samples(6, seed=4)
    samples = [
        Sample(s.session_id, s.completion_id, s.prompt_ids, s.output_ids, s.behave_logprobs,
               s.advantage, 3 if i % 2 else 2)
        for i, s in enumerate(samples)
    ]  # fmt: skip
    reference = copy.deepcopy(model)
    metrics = policy_update(model, torch.optim.SGD(model.parameters(), lr=0.0), samples,
                            config(), PAD_ID, current_version=3)  # fmt: skip
    sums = {2: [0.0, 0.0], 3: [0.0, 0.0]}
    entropy, tokens = 0.0, 0
    with torch.no_grad():
        for s in samples:
            ids = torch.tensor([s.prompt_ids + s.output_ids])
            logits = reference(input_ids=ids).logits[0].double()
            logprobs = torch.log_softmax(logits, dim=-1)
            for j, token in enumerate(s.output_ids):
                row = logprobs[len(s.prompt_ids) + j - 1]
                sums[s.version][0] += s.behave_logprobs[j] - float(row[token])
                sums[s.version][1] += 1
                entropy -= float((row.exp() * row).sum())
                tokens += 1
    assert metrics["kl_staleness"] == pytest.approx(sums[2][0] / sums[2][1], rel=1e-5)
    assert metrics["kl_mismatch"] == pytest.approx(sums[3][0] / sums[3][1], rel=1e-5)
    assert (metrics["stale_tokens"], metrics["fresh_tokens"]) == (sums[2][1], sums[3][1])
    assert metrics["entropy"] == pytest.approx(entropy / tokens, rel=1e-5)


@pytest.fixture
def dropout_checkpoint(tmp_path):
    """A Qwen2 checkpoint whose config asks for attention dropout (vLLM would ignore it)."""
    from transformers import Qwen2ForCausalLM

    shape = PRESETS["tiny"]
    cfg = build_config(shape)
    cfg.attention_dropout = 0.5
    torch.manual_seed(0)
    Qwen2ForCausalLM(cfg).save_pretrained(tmp_path)
    return tmp_path


def test_dropout_in_the_checkpoint_does_not_reach_the_updates_log_probs(dropout_checkpoint):
    samples = random_samples(4, seed=5)
    batch = collate(samples, PAD_ID)

    def logprobs(model):
        logits = model(input_ids=batch.inputs, attention_mask=batch.attention).logits
        return token_logprobs(logits[:, :-1], batch.targets)

    with torch.no_grad():
        raw = load_reference_model(dropout_checkpoint)
        evaluated = logprobs(raw)
        raw.train()
        assert not torch.equal(logprobs(raw), evaluated)  # the checkpoint does have dropout
        model = prepare_model(
            load_reference_model(dropout_checkpoint), config(), torch.device("cpu")
        )
        model.train()  # as policy_update runs it (gradient checkpointing needs train mode)
        assert torch.equal(logprobs(model), evaluated)
        assert model.config.attention_dropout == 0.0
    metrics = policy_update(model, torch.optim.SGD(model.parameters(), lr=0.0), samples,
                            config(), PAD_ID)  # fmt: skip
    assert metrics["ratio_mean"] == 1.0


def test_under_bfloat16_autocast_the_lm_head_computes_in_float32() -> None:
    model, batch = tiny_model(), collate(random_samples(2), PAD_ID)
    names = list(model.state_dict())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain = model(input_ids=batch.inputs).logits
    scoring_mode(model)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        ours = model(input_ids=batch.inputs).logits
    assert plain.dtype == torch.bfloat16 and ours.dtype == torch.float32
    with torch.no_grad():
        fp32 = model(input_ids=batch.inputs).logits
    assert 0 < (ours - fp32).abs().max() < 0.05 * fp32.abs().max()  # the body still ran in bf16
    assert list(model.state_dict()) == names  # the weights' names, and so the files, unchanged


def test_one_sample_over_two_epochs_is_restored_too(monkeypatch) -> None:
    """One sample makes one minibatch whatever `minibatches` says, but two epochs still make two
    steps: the second one's NaN must undo the first."""
    model, samples = tiny_model(), random_samples(1)
    optimizer, before = adamw(model), weights(model)
    monkeypatch.setenv(NAN_LOSS_ENV, "2")
    cfg = config(minibatches=4, epochs=2)
    with pytest.raises(NonFiniteUpdate, match="step 2 of 2"):
        policy_update(model, optimizer, samples, cfg, PAD_ID, loss_hook=nan_loss)
    assert all(torch.equal(weights(model)[k], before[k]) for k in before)
    assert optimizer.state_dict()["state"] == {}


def test_an_infinite_gradient_with_a_finite_loss_is_refused_too() -> None:
    """A gradient hook makes one parameter's gradient infinite (as an overflow inside a backward
    kernel would): the loss is finite, the global norm is not, and nothing is stepped."""
    model, samples = tiny_model(), random_samples(4)
    optimizer, before = adamw(model), weights(model)
    first = next(p for p in model.parameters() if p.requires_grad)
    handle = first.register_hook(lambda grad: grad * float("inf"))
    try:
        with pytest.raises(NonFiniteUpdate, match="gradient norm of optimizer step 1 of 1"):
            policy_update(model, optimizer, samples, config(), PAD_ID)
    finally:
        handle.remove()
    assert all(torch.equal(weights(model)[k], before[k]) for k in before)
    assert optimizer.state_dict()["state"] == {}
