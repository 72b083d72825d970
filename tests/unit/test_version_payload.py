"""What a full-weight version ships: a delta in `delta_dtype` (bf16 by default), adopted by the
reference so that the next delta carries this one's rounding; full weights at an anchor."""

from __future__ import annotations

import pytest
import torch

from trainer.config import TrainerConfig
from trainer.loop.payload import version_payload
from trainer.models.weights import state_dict
from trainer.weight_update.files import DeltaFile, FullFile


def tiny() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.LayerNorm(16))


def served_and_stepped() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """(model after a small step on its first layer only, the weights served before it)."""
    model = tiny()
    served = {k: v.clone() for k, v in state_dict(model).items()}
    with torch.no_grad():
        model[0].weight += 1e-4 * torch.randn(16, 16)
        model[0].bias += 1e-4 * torch.randn(16)
    return model, served


def test_a_bf16_delta_leaves_out_unchanged_tensors_and_the_reference_adopts_it() -> None:
    model, served = served_and_stepped()
    stepped = {k: v.clone() for k, v in state_dict(model).items()}
    payload, kind = version_payload(False, model, state_dict(model), served, 1, 10, "bfloat16")
    assert kind is DeltaFile
    assert set(payload) == {"0.weight", "0.bias"}  # the LayerNorm did not change
    assert all(t.dtype == torch.bfloat16 for t in payload.values())
    now = state_dict(model)
    for name, value in payload.items():  # served + delta in fp32, what a backend computes
        assert torch.equal(now[name], served[name] + value.float())
    # the rounding is small: a bf16 step is the fp32 step to 2^-8 of its own size
    step = stepped["0.weight"] - served["0.weight"]
    assert (now["0.weight"] - stepped["0.weight"]).abs().max() <= step.abs().max() * 2**-8


def test_the_next_delta_carries_the_rounding_of_the_last() -> None:
    model, served = served_and_stepped()
    exact = {k: v.clone() for k, v in state_dict(model).items()}
    version_payload(False, model, state_dict(model), served, 1, 10, "bfloat16")
    adopted = {k: v.clone() for k, v in state_dict(model).items()}
    # an fp32 delta now, from the adopted weights back to the exact ones, is the residual
    residual, _ = version_payload(False, model, exact, adopted, 2, 10, "float32")
    assert set(residual) == {"0.weight", "0.bias"}
    for name, value in residual.items():
        assert torch.allclose(adopted[name] + value, exact[name], rtol=0, atol=1e-9)


def test_an_fp32_delta_leaves_the_reference_untouched() -> None:
    model, served = served_and_stepped()
    before = {k: v.clone() for k, v in state_dict(model).items()}
    payload, kind = version_payload(False, model, state_dict(model), served, 1, 10, "float32")
    assert kind is DeltaFile and payload["0.weight"].dtype == torch.float32
    assert all(torch.equal(before[k], v) for k, v in state_dict(model).items())


def test_an_anchor_version_ships_full_fp32_weights() -> None:
    model, served = served_and_stepped()
    payload, kind = version_payload(False, model, state_dict(model), served, 10, 10, "bfloat16")
    assert kind is FullFile
    assert set(payload) == set(served) and payload["0.weight"].dtype == torch.float32


def test_delta_dtype_must_be_a_known_dtype() -> None:
    with pytest.raises(ValueError, match="delta_dtype"):
        TrainerConfig(delta_dtype="float8")
    assert TrainerConfig().delta_dtype == "bfloat16"
