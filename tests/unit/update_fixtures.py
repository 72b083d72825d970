"""Shared by the update tests: a tiny model, random samples of mixed lengths, a parameter diff."""

from __future__ import annotations

import random

import torch

from trainer.loop.samples import Sample
from trainer.models.byte_model import ENDOFTEXT_ID, PRESETS, VOCAB_SIZE, build_model

PAD_ID = ENDOFTEXT_ID
EPS32 = torch.finfo(torch.float32).eps


def tiny_model(seed: int = 0) -> torch.nn.Module:
    return build_model(PRESETS["tiny"], seed)


def random_samples(n: int, seed: int = 0, max_len: int = 48) -> list[Sample]:
    """n samples with prompts of 2-20 and outputs of 1-(max_len-20) tokens, advantages +-1."""
    rng = random.Random(seed)
    samples = []
    for i in range(n):
        prompt = [rng.randrange(VOCAB_SIZE) for _ in range(rng.randint(2, 20))]
        output = [rng.randrange(VOCAB_SIZE) for _ in range(rng.randint(1, max_len - 20))]
        behave = [-5.5 + rng.uniform(-0.5, 0.5) for _ in output]  # near log(1/259) = -5.56
        samples.append(Sample("s", f"c{i}", prompt, output, behave, rng.choice([-1.0, 1.0]), 0))
    return samples


def assert_same_update(
    a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], before: dict, rtol: float
) -> None:
    """Weights after two runs of one update agree: |a - b| <= rtol * (the tensor's largest step)
    + one fp32 ulp of the weight (each run rounds the new weight once), for every parameter."""
    assert a.keys() == b.keys()
    for name, pa in a.items():
        pb = b[name]
        step = (pa - before[name]).abs().max()
        assert step > 0, f"{name} did not move"
        bound = rtol * step + EPS32 * pa.abs()  # elementwise
        excess = ((pa - pb).abs() - bound).max()
        assert excess <= 0, f"{name}: updates differ by {excess:.3e} beyond {rtol} of {step:.3e}"


def weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def interleaved_samples(n: int = 12) -> list[Sample]:
    """Long (40-48 tokens) and short (4-8 tokens) samples alternating. Split over two ranks (every
    other sample), rank 0 gets the long ones, one micro-batch each at a 48-token budget, and rank
    1 the short ones, several to a micro-batch: rank 1 runs empty micro-batches to keep up."""
    rng = random.Random(7)
    samples = []
    for i in range(n):
        total = rng.randint(40, 48) if i % 2 == 0 else rng.randint(4, 8)
        p = rng.randint(2, total // 2)
        prompt = [rng.randrange(VOCAB_SIZE) for _ in range(p)]
        output = [rng.randrange(VOCAB_SIZE) for _ in range(total - p)]
        behave = [-5.5 + rng.uniform(-0.5, 0.5) for _ in output]
        samples.append(Sample("s", f"c{i}", prompt, output, behave, rng.choice([-1.0, 1.0]), 0))
    return samples
