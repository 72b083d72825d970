"""The update path: micro-batching and bf16 leave the update what it was; an OOM changes nothing."""

from __future__ import annotations

import copy
import dataclasses
import time

import pytest
import torch
from update_fixtures import PAD_ID, assert_same_update, random_samples, tiny_model, weights

from trainer.config import TrainerConfig
from trainer.loop.loss import token_logprobs
from trainer.loop.microbatch import SampleTooLong, pack_microbatches, sample_tokens
from trainer.loop.samples import collate
from trainer.loop.sampling_processing import SamplingSettings
from trainer.loop.update import UpdateOutOfMemory, batch_logprobs, plan_update, policy_update

WHOLE = 1 << 20  # a budget no test batch reaches: one micro-batch per minibatch
# Two fp32 updates of the same gradient summed in a different order (per micro-batch, with other
# padded shapes, so other matmul blockings) differ by a few ulps of the largest gradient entry:
# measured <= 6e-7 of a tensor's largest step over 4 seeds. Each final weight is also rounded once
# (half an ulp of the weight, for each of the two runs). See update_fixtures.assert_same_update.
RTOL = 2e-6


def config(**fields) -> TrainerConfig:
    return TrainerConfig(**{"max_tokens_per_sample": 48, "grad_clip": 1e9, **fields})


def update(model, samples, cfg, optimizer=None):
    optimizer = optimizer or torch.optim.SGD(model.parameters(), lr=0.1)
    return policy_update(model, optimizer, samples, cfg, PAD_ID)


@pytest.mark.parametrize("budget", [48, 64, 160])
def test_micro_batched_update_equals_the_whole_batch_update(budget: int) -> None:
    """SGD, not AdamW: SGD's step is proportional to the gradient, so a wrongly normalised
    accumulation (a mean of micro-batch means, a missing 1/N) shows; Adam's first step is
    +-lr whatever the gradient's scale and would hide it. Clipping is off for the same reason."""
    samples, base = random_samples(12), tiny_model()
    before = weights(base)
    whole, micro = copy.deepcopy(base), copy.deepcopy(base)
    cfg = config(max_tokens_per_microbatch=budget)
    assert len(plan_update(samples, cfg, PAD_ID, torch.device("cpu")).microbatches[0]) > 1
    m_whole = update(whole, samples, config(max_tokens_per_microbatch=WHOLE))
    m_micro = update(micro, samples, cfg)
    assert_same_update(weights(micro), weights(whole), before, RTOL)
    for key in ("loss", "grad_norm", "kl_behave", "ratio_mean", "tokens"):
        assert m_micro[key] == pytest.approx(m_whole[key], rel=1e-6), key


def test_micro_batching_holds_over_several_minibatches() -> None:
    """Two optimizer steps: the second starts from weights that already differ by rounding, so
    the disagreement compounds (measured <= 3e-6); the tolerance is 1e-5."""
    samples, base = random_samples(12, seed=3), tiny_model(3)
    before = weights(base)
    whole, micro = copy.deepcopy(base), copy.deepcopy(base)
    update(whole, samples, config(max_tokens_per_microbatch=WHOLE, minibatches=2))
    update(micro, samples, config(max_tokens_per_microbatch=48, minibatches=2))
    assert_same_update(weights(micro), weights(whole), before, 1e-5)


def test_gradient_checkpointing_gives_the_same_update() -> None:
    samples, base = random_samples(8, seed=1), tiny_model(1)
    before = weights(base)
    plain, checkpointed = copy.deepcopy(base), copy.deepcopy(base)
    checkpointed.gradient_checkpointing_enable(
        gradient_checkpointing_kwargs={"use_reentrant": False}
    )
    update(plain, samples, config(max_tokens_per_microbatch=64))
    update(checkpointed, samples, config(max_tokens_per_microbatch=64, gradient_checkpointing=True))
    assert checkpointed.is_gradient_checkpointing
    assert_same_update(weights(checkpointed), weights(plain), before, RTOL)


def test_the_first_minibatch_is_exactly_on_policy() -> None:
    """pi_prox of the first minibatch is pi_theta detached: the ratio is exactly 1, no clip."""
    metrics = update(tiny_model(), random_samples(6), config(max_tokens_per_microbatch=64))
    assert metrics["ratio_mean"] == 1.0 and metrics["clip_frac"] == 0.0


def test_bfloat16_autocast_keeps_float32_master_weights_and_moments() -> None:
    model, samples = tiny_model(), random_samples(6)
    before = weights(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    metrics = update(
        model, samples, config(dtype="bfloat16", max_tokens_per_microbatch=64), optimizer
    )
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values())
    for name, param in model.named_parameters():
        assert param.dtype == torch.float32
        assert optimizer.state[param]["exp_avg"].dtype == torch.float32
        # lr 1e-5 on weights of ~0.02 is ~2^-11 of a weight: a bf16 weight would not move at all.
        if name.endswith("proj.weight"):
            moved = (param.detach() - before[name]).ne(0).float().mean()
            assert moved > 0.5, f"{name}: only {moved:.0%} of the weights moved"


def test_packing_counts_padding_and_keeps_every_sample() -> None:
    samples = random_samples(20, seed=2)
    groups = pack_microbatches(samples, 96)
    assert sorted(s.completion_id for g in groups for s in g) == sorted(
        s.completion_id for s in samples
    )
    for group in groups:
        assert len(group) * max(sample_tokens(s) for s in group) <= 96


def test_a_sample_over_the_budget_is_refused_with_the_settings_to_change() -> None:
    with pytest.raises(SampleTooLong, match="max_tokens_per_sample <= max_tokens_per_microbatch"):
        pack_microbatches(random_samples(3, max_len=48), 21)


class OutOfMemoryOnCall:
    """A forward hook that raises torch.OutOfMemoryError on its n-th call (a real OOM cannot be
    provoked on a CPU)."""

    def __init__(self, n: int) -> None:
        self.n, self.calls = n, 0

    def __call__(self, module, args, output):
        self.calls += 1
        if self.calls == self.n:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


def test_an_out_of_memory_update_names_the_settings_and_changes_nothing() -> None:
    model, samples = tiny_model(), random_samples(12)
    before = weights(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    hook = OutOfMemoryOnCall(3)  # the third micro-batch's forward: two have backpropagated
    model.model.layers[1].register_forward_hook(hook)
    cfg = config(max_tokens_per_microbatch=48)
    with pytest.raises(UpdateOutOfMemory) as caught:
        update(model, samples, cfg, optimizer)
    message = str(caught.value)
    assert "max_tokens_per_microbatch" in message and "gradient_checkpointing=True" in message
    assert "unchanged" in message and caught.value.steps_taken == 0
    assert hook.calls == 3
    for name, param in model.named_parameters():
        assert torch.equal(param.detach(), before[name]), name
        assert param.grad is None, name
    assert optimizer.state == {} and not model.training


def test_an_out_of_memory_after_a_step_says_what_to_restore() -> None:
    model, samples = tiny_model(), random_samples(12)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    cfg = config(max_tokens_per_microbatch=48, minibatches=2)
    first, second = plan_update(samples, cfg, PAD_ID, torch.device("cpu")).microbatches
    # The proximal pass over the second minibatch runs first, then the first minibatch trains and
    # steps; fail in the second minibatch's first training forward.
    hook = OutOfMemoryOnCall(len(second) + len(first) + 1)
    model.model.layers[0].register_forward_hook(hook)
    with pytest.raises(UpdateOutOfMemory, match="1 optimizer step") as caught:
        update(model, samples, cfg, optimizer)
    assert caught.value.steps_taken == 1
    assert all(p.grad is None for p in model.parameters())


def test_state_helpers_work_in_one_process_too() -> None:
    from trainer.loop.distributed import full_optimizer_state, load_full_state, load_optimizer_state

    model, other = tiny_model(0), tiny_model(5)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    update(model, random_samples(4), config(max_tokens_per_microbatch=64), optimizer)
    load_full_state(other, weights(model))
    mine, theirs = weights(other), weights(model)
    assert all(torch.equal(mine[name], theirs[name]) for name in theirs)
    saved = full_optimizer_state(model, optimizer)
    assert set(saved["state"]) == set(weights(model))  # keyed by parameter name
    fresh = torch.optim.AdamW(other.parameters(), lr=1e-3)
    load_optimizer_state(other, fresh, saved)
    assert torch.equal(
        fresh.state_dict()["state"][0]["exp_avg"], optimizer.state_dict()["state"][0]["exp_avg"]
    )


def test_a_scheduled_update_warms_the_learning_rate_up_step_by_step() -> None:
    model = tiny_model(0)
    cfg = config(lr=1e-3, lr_warmup_steps=4, minibatches=2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.learning_rate)
    first = policy_update(model, optimizer, random_samples(4), cfg, PAD_ID, scheduled=True)
    assert first["lr"] == pytest.approx(cfg.lr_at(2))  # the update's last step: 2 of 4
    second = policy_update(model, optimizer, random_samples(4), cfg, PAD_ID, scheduled=True)
    assert second["lr"] == pytest.approx(1e-3)  # steps 3 and 4: warm
    assert optimizer.param_groups[0]["lr"] == pytest.approx(1e-3)


def test_samples_drawn_at_other_temperatures_and_masks_are_scored_under_them() -> None:
    """Fresh data sampled at temperature 0.5 with top-p 0.9, at 0.8 with top-k 20 and min-p 0.05,
    and at temperature 1, its behaviour log-probs the model's own under those settings: every
    importance weight is 1, whether the batch is split into micro-batches or not."""
    base = tiny_model(5)
    settings = [
        SamplingSettings(temperature=0.5, top_p=0.9),
        None,
        SamplingSettings(temperature=0.8, top_k=20, min_p=0.05),
    ]
    samples = [
        dataclasses.replace(s, sampling=settings[i % 3])
        for i, s in enumerate(random_samples(9, seed=5))
    ]
    batch = collate(samples, PAD_ID)
    with torch.no_grad():
        own = batch_logprobs(base.eval(), batch)
        logits = base(input_ids=batch.inputs, attention_mask=batch.attention).logits[:, :-1]
        plain = token_logprobs(logits, batch.targets)
    outputs = batch.mask.bool()
    assert (own[0] - plain[0])[outputs[0]].abs().max() > 0.1  # scored at temperature 0.5
    assert torch.equal(own[1], plain[1])  # recorded without settings: temperature 1, as before
    samples = [
        dataclasses.replace(s, behave_logprobs=own[i][batch.mask[i].bool()].tolist())
        for i, s in enumerate(samples)
    ]
    before = weights(base)
    whole, micro = copy.deepcopy(base), copy.deepcopy(base)
    m_whole = update(whole, samples, config(max_tokens_per_microbatch=WHOLE))
    m_micro = update(micro, samples, config(max_tokens_per_microbatch=48))
    for metrics in (m_whole, m_micro):
        assert metrics["imp_weight_mean"] == pytest.approx(1.0, abs=1e-5)
        assert metrics["kl_behave"] == pytest.approx(0.0, abs=1e-5)
    assert_same_update(weights(micro), weights(whole), before, RTOL)


@pytest.mark.parametrize(
    ("fields", "proximal"),
    [({}, False), ({"minibatches": 2}, True), ({"epochs": 2}, True)],
    ids=["one-step", "two-minibatches", "two-epochs"],
)
def test_the_update_says_where_its_time_went(fields: dict, proximal: bool) -> None:
    """Wall seconds of the forward/backward passes and the optimizer steps, and of the extra
    forward for pi_prox only where one is needed (not for one minibatch of one epoch)."""
    model = tiny_model(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    started = time.perf_counter()
    metrics = policy_update(model, optimizer, random_samples(8), config(**fields), PAD_ID)
    elapsed = time.perf_counter() - started
    timed = [metrics[k] for k in ("proximal_s", "forward_backward_s", "optimizer_s")]
    assert metrics["forward_backward_s"] > 0 and metrics["optimizer_s"] > 0
    assert (metrics["proximal_s"] > 0) is proximal
    assert metrics["proximal_s"] >= 0
    assert sum(timed) <= elapsed  # disjoint parts of the update
