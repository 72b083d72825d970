"""The global grad-norm clip is torch's clip_grad_norm_, with or without clipping."""

from __future__ import annotations

import pytest
import torch

from trainer.loop.collectives import clip_grad_norm


@pytest.mark.parametrize("max_norm", [0.5, 1e3])  # clips / leaves the gradients as they are
def test_clip_grad_norm_is_torchs(max_norm: float) -> None:
    gen = torch.Generator().manual_seed(0)
    ours = [torch.nn.Parameter(torch.zeros(7, 3)), torch.nn.Parameter(torch.zeros(5))]
    theirs = [torch.nn.Parameter(torch.zeros(7, 3)), torch.nn.Parameter(torch.zeros(5))]
    for a, b in zip(ours, theirs, strict=True):
        a.grad = torch.randn(a.shape, generator=gen)
        b.grad = a.grad.clone()
    norm = clip_grad_norm(ours, max_norm)
    expected = torch.nn.utils.clip_grad_norm_(theirs, max_norm)
    assert norm == pytest.approx(float(expected), rel=1e-7)
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a.grad, b.grad)
