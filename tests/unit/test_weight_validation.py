"""A staged weight update is refused when any tensor holds NaN or infinity, wherever it sits."""

import pytest
import torch

from rlgw.weight_files import _all_finite, validate_update

EXPECTED = {"a.weight": (4, 6), "b.bias": (1000,)}
FLOATS = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def update(dtype=torch.float32) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {name: torch.randn(shape, generator=gen).to(dtype) for name, shape in EXPECTED.items()}


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("position", [0, 517, 999])
def test_a_single_non_finite_value_anywhere_is_refused(dtype, bad, position):
    tensors = update(dtype)
    tensors["b.bias"][position] = bad
    problems = validate_update(tensors, "delta", EXPECTED)
    assert problems == ["b.bias: contains NaN or infinity"]


@pytest.mark.parametrize("dtype", FLOATS)
def test_finite_values_pass_even_at_the_dtype_limits(dtype):
    tensors = update(dtype)
    tensors["a.weight"][0, 0] = torch.finfo(dtype).max
    tensors["a.weight"][0, 1] = torch.finfo(dtype).min
    tensors["a.weight"][0, 2] = torch.finfo(dtype).tiny
    assert validate_update(tensors, "delta", EXPECTED) == []


def test_non_contiguous_and_empty_tensors():
    weight = torch.randn(6, 4).t()  # a transposed view
    weight[3, 2] = float("nan")
    assert not _all_finite(weight)
    assert _all_finite(torch.randn(6, 4).t())
    assert _all_finite(torch.empty(0))


def test_other_problems_are_still_reported():
    tensors = update()
    tensors["c.weight"] = torch.zeros(2)
    tensors["a.weight"] = torch.zeros(3, 3)
    tensors["b.bias"] = torch.zeros(1000, dtype=torch.int32)
    problems = validate_update(tensors, "full", {**EXPECTED, "d.weight": (2,)})
    assert "unknown parameter c.weight" in problems
    assert "a.weight: shape (3, 3), expected (4, 6)" in problems
    assert "b.bias: dtype torch.int32 is not floating point" in problems
    assert any(p.startswith("full update misses 1 parameters") for p in problems)
    assert validate_update(tensors, "sideways", EXPECTED)[0].startswith("kind must be one of")
    assert validate_update({}, "delta", EXPECTED) == ["the update holds no tensors"]
